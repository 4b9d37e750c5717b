import { BadRequestException, type PipeTransform } from '@nestjs/common';

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
    if (typeof body?.to !== 'string' || body.to.length === 0) {
      throw new BadRequestException('to must name the SKU to move stock to');
    }
    return { to: body.to, quantity: new PurchasePipe().transform(value).quantity };
  }
}
