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
