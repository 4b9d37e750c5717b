import { BadRequestException, type PipeTransform } from '@nestjs/common';

/**
 * A SKU from the URL, in the one spelling the lock key is built from. The lock key comes from the
 * request, so every spelling of one product must give one key (`/products/Widget` and
 * `/products/%20widget` are the product `widget`: two spellings, two keys, two purchases at once)
 * and anything that is not a SKU is refused before the lock: Unicode NFC, trimmed, lower case,
 * letters, digits and dashes only, at most 64 characters.
 */
export class SkuPipe implements PipeTransform<unknown, string> {
  transform(value: unknown): string {
    return canonicalSku(value, 'sku');
  }
}

function canonicalSku(value: unknown, name: string): string {
  const sku = typeof value === 'string' ? value.normalize('NFC').trim().toLowerCase() : '';
  if (!/^[a-z0-9][a-z0-9-]{0,63}$/.test(sku)) {
    throw new BadRequestException(
      `${name} must be a SKU: letters, digits and dashes, at most 64 characters`,
    );
  }
  return sku;
}

export interface PurchaseDto {
  quantity: number;
}

/** Validates a purchase body; runs before the handler, hence before @WithLock resolves its key. */
export class PurchasePipe implements PipeTransform<unknown, PurchaseDto> {
  transform(value: unknown): PurchaseDto {
    const quantity = (value as Partial<PurchaseDto> | undefined)?.quantity ?? 1;
    if (!Number.isInteger(quantity) || quantity < 1) {
      throw new BadRequestException('quantity must be a whole number >= 1');
    }
    return { quantity };
  }
}

export interface MoveDto {
  to: string;
  quantity: number;
}

/** Validates a move body: the SKU to move stock to, and how much (default 1). */
export class MovePipe implements PipeTransform<unknown, MoveDto> {
  transform(value: unknown): MoveDto {
    const body = value as Partial<MoveDto> | undefined;
    return {
      to: canonicalSku(body?.to, 'to'),
      quantity: new PurchasePipe().transform(value).quantity,
    };
  }
}
