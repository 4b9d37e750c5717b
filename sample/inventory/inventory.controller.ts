import {
  Body,
  Controller,
  Get,
  HttpCode,
  Inject,
  Param,
  Post,
  Put,
  Sse,
  type MessageEvent,
} from '@nestjs/common';
import { concatMap, from, interval, map, take, type Observable } from 'rxjs';
import { WithLock } from '../../lib/index.js';
import { InventoryService, type PurchaseResult } from './inventory.service.js';
import { PurchasePipe, type PurchaseDto } from './purchase.dto.js';

@Controller('products')
export class InventoryController {
  constructor(@Inject(InventoryService) private readonly inventory: InventoryService) {}

  @Get()
  async list(): Promise<string[]> {
    return this.inventory.skus();
  }

  @Get(':sku')
  async get(@Param('sku') sku: string): Promise<{ sku: string; stock: number }> {
    return { sku, stock: await this.inventory.stock(sku) };
  }

  /** One purchase per SKU at a time, across every instance of the app. */
  @Post(':sku/purchase')
  @WithLock({ key: 'sku:{0}' })
  async purchase(
    @Param('sku') sku: string,
    @Body(PurchasePipe) body: PurchaseDto,
  ): Promise<PurchaseResult> {
    // inventory.purchase() locks sku:<sku> too: it re-enters the lock this handler holds.
    return this.inventory.purchase(sku, body.quantity);
  }

  /** The same purchase without any lock: concurrent calls oversell. Here to show the race. */
  @Post(':sku/purchase-unlocked')
  async purchaseUnlocked(
    @Param('sku') sku: string,
    @Body(PurchasePipe) body: PurchaseDto,
  ): Promise<PurchaseResult> {
    return this.inventory.sell(sku, body.quantity);
  }

  @Put(':sku/stock')
  @HttpCode(204)
  async setStock(@Param('sku') sku: string, @Body() body: { quantity: number }): Promise<void> {
    await this.inventory.setStock(sku, body.quantity);
  }

  /**
   * Counts the shelf while no purchase of this SKU may happen: the lock is taken when the stream
   * is subscribed and held until it completes or the client goes away.
   */
  @Sse(':sku/stocktake')
  @WithLock({ key: 'sku:{0}' })
  stocktake(@Param('sku') sku: string): Observable<MessageEvent> {
    return interval(Number(process.env.STOCKTAKE_STEP ?? 200)).pipe(
      take(5),
      concatMap((step) => from(this.inventory.stock(sku)).pipe(map((stock) => ({ step, stock })))),
      map((data) => ({ data })),
    );
  }
}
