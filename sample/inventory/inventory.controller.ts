import {
  BadRequestException,
  Body,
  Controller,
  Get,
  Header,
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
import { InventoryService, type MoveResult, type PurchaseResult } from './inventory.service.js';
import {
  MovePipe,
  PurchasePipe,
  SkuPipe,
  StockPipe,
  type MoveDto,
  type PurchaseDto,
} from './purchase.dto.js';

@Controller('products')
export class InventoryController {
  constructor(@Inject(InventoryService) private readonly inventory: InventoryService) {}

  @Get()
  async list(): Promise<string[]> {
    return this.inventory.skus();
  }

  /**
   * Stock of every SKU as CSV. An export reads everything and is heavy: at most two run at once
   * across all instances (a counting semaphore); a third answers 409 while they run.
   */
  @Get('export.csv')
  @Header('content-type', 'text/csv')
  @WithLock({ key: 'export', limit: 2 })
  async export(): Promise<string> {
    const rows = [];
    for (const sku of await this.inventory.skus()) {
      rows.push(`${sku},${await this.inventory.stock(sku)}`);
    }
    return ['sku,stock', ...rows].join('\n') + '\n';
  }

  @Get(':sku')
  async get(@Param('sku', SkuPipe) sku: string): Promise<{ sku: string; stock: number }> {
    return { sku, stock: await this.inventory.stock(sku) };
  }

  /**
   * One purchase per SKU at a time, across every instance of the app. The key comes from the URL:
   * `SkuPipe` gives each product one spelling (and refuses what is not a SKU) before the lock is
   * taken, guards (authorisation) run before it too, and a busy SKU answers 409 after the module's
   * short `acquireTimeout` (2 s) instead of holding the request.
   */
  @Post(':sku/purchase')
  @WithLock({ key: 'sku:{0}' })
  async purchase(
    @Param('sku', SkuPipe) sku: string,
    @Body(PurchasePipe) body: PurchaseDto,
  ): Promise<PurchaseResult> {
    // inventory.purchase() locks sku:<sku> too: it re-enters the lock this handler holds.
    return this.inventory.purchase(sku, body.quantity);
  }

  /** The same purchase without any lock: concurrent calls oversell. Here to show the race. */
  @Post(':sku/purchase-unlocked')
  async purchaseUnlocked(
    @Param('sku', SkuPipe) sku: string,
    @Body(PurchasePipe) body: PurchaseDto,
  ): Promise<PurchaseResult> {
    return this.inventory.sell(sku, body.quantity);
  }

  /** Moves stock to another SKU; `inventory.move()` locks both SKUs together. */
  @Post(':sku/move')
  async move(
    @Param('sku', SkuPipe) sku: string,
    @Body(MovePipe) body: MoveDto,
  ): Promise<MoveResult> {
    if (body.to === sku) throw new BadRequestException('cannot move stock to the same SKU');
    return this.inventory.move(sku, body.to, body.quantity);
  }

  @Put(':sku/stock')
  @HttpCode(204)
  async setStock(
    @Param('sku', SkuPipe) sku: string,
    @Body(StockPipe) body: PurchaseDto,
  ): Promise<void> {
    await this.inventory.setStock(sku, body.quantity);
  }

  /**
   * Counts the shelf while no purchase of this SKU may happen: a read lock, taken when the stream
   * is subscribed and held until it completes or the client goes away. Several stocktakes of one
   * SKU run side by side; purchases (writers) wait for them, and new stocktakes wait for a
   * waiting purchase.
   */
  @Sse(':sku/stocktake')
  @WithLock({ key: 'sku:{0}', mode: 'read' })
  stocktake(@Param('sku', SkuPipe) sku: string): Observable<MessageEvent> {
    return interval(Number(process.env.STOCKTAKE_STEP ?? 200)).pipe(
      take(5),
      concatMap((step) => from(this.inventory.stock(sku)).pipe(map((stock) => ({ step, stock })))),
      map((data) => ({ data })),
    );
  }
}
