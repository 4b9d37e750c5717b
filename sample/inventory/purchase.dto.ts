import { BadRequestException, type PipeTransform } from '@nestjs/common';
import { RpcException } from '@nestjs/microservices';

/** How a pipe refuses its input: a 400 over HTTP, an `RpcException` over the microservice. */
type Refuse = (message: string) => never;

const badRequest: Refuse = (message) => {
  throw new BadRequestException(message);
};
const badMessage: Refuse = (message) => {
  throw new RpcException({ status: 'error', code: 'BAD_REQUEST', message });
};

/**
 * A SKU from the URL, in the one spelling the lock key is built from. The lock key comes from the
 * request, so every spelling of one product must give one key (`/products/Widget` and
 * `/products/%20widget` are the product `widget`: two spellings, two keys, two purchases at once)
 * and anything that is not a SKU is refused before the lock: Unicode NFC, trimmed, lower case,
 * letters, digits and dashes only, at most 64 characters.
 */
export class SkuPipe implements PipeTransform<unknown, string> {
  transform(value: unknown): string {
    return canonicalSku(value, 'sku', badRequest);
  }
}

function canonicalSku(value: unknown, name: string, refuse: Refuse): string {
  const sku = typeof value === 'string' ? value.normalize('NFC').trim().toLowerCase() : '';
  if (!/^[a-z0-9][a-z0-9-]{0,63}$/.test(sku)) {
    refuse(`${name} must be a SKU: letters, digits and dashes, at most 64 characters`);
  }
  return sku;
}

/** A whole number of items, at least `min`; `fallback` when not given. */
function quantityOf(value: unknown, min: number, refuse: Refuse, fallback?: number): number {
  const quantity = (value as { quantity?: unknown } | undefined)?.quantity ?? fallback;
  if (typeof quantity !== 'number' || !Number.isSafeInteger(quantity) || quantity < min) {
    refuse(`quantity must be a whole number >= ${min}`);
  }
  return quantity;
}

export interface PurchaseDto {
  quantity: number;
}

/** Validates a purchase body; runs before the handler, hence before @WithLock resolves its key. */
export class PurchasePipe implements PipeTransform<unknown, PurchaseDto> {
  transform(value: unknown): PurchaseDto {
    return { quantity: quantityOf(value, 1, badRequest, 1) };
  }
}

/** Validates a stock count (`PUT /products/:sku/stock`): a whole number >= 0. */
export class StockPipe implements PipeTransform<unknown, PurchaseDto> {
  transform(value: unknown): PurchaseDto {
    return { quantity: quantityOf(value, 0, badRequest) };
  }
}

export interface PurchaseMessage {
  sku: string;
  quantity: number;
}

/**
 * Validates a purchase message of the microservice: its SKU in the one spelling the HTTP routes
 * use (the lock key is built from it: one product, one lock, whichever transport asks) and its
 * quantity, before `@WithLock` builds the key.
 */
export class PurchaseMessagePipe implements PipeTransform<unknown, PurchaseMessage> {
  transform(value: unknown): PurchaseMessage {
    return {
      sku: canonicalSku((value as { sku?: unknown } | undefined)?.sku, 'sku', badMessage),
      quantity: quantityOf(value, 1, badMessage, 1),
    };
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
      to: canonicalSku(body?.to, 'to', badRequest),
      quantity: quantityOf(value, 1, badRequest, 1),
    };
  }
}
