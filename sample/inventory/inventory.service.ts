import {
  Inject,
  Injectable,
  NotFoundException,
  UnprocessableEntityException,
} from '@nestjs/common';
import { getCurrentLock, WithLock } from '../../lib/index.js';
import { RedisConnection } from '../redis.provider.js';
import { SampleConfig } from '../sample.config.js';

export interface MoveResult {
  from: string;
  to: string;
  quantity: number;
  /** Stock of both SKUs after the move. */
  remaining: Record<string, number>;
  /** The fence of each SKU's lock: recorded with the move. */
  fences: Readonly<Record<string, number>>;
}

export interface PurchaseResult {
  sku: string;
  quantity: number;
  remaining: number;
  /** Fencing token of the lock the purchase ran under: recorded with the sale. */
  fence: number | undefined;
}

/**
 * Stock kept in Redis and changed read-modify-write, the way real services often do it (read the
 * row, check, call the payment provider, write back). Without a lock, two concurrent purchases
 * both see the last item and both sell it.
 */
@Injectable()
export class InventoryService {
  constructor(
    @Inject(RedisConnection) private readonly redis: RedisConnection,
    @Inject(SampleConfig) private readonly config: SampleConfig,
  ) {}

  async stock(sku: string): Promise<number> {
    const value = await this.redis.client.get(stockKey(sku));
    if (value === null) throw new NotFoundException(`Unknown product ${sku}`);
    return Number(value);
  }

  /** Sells `quantity` items. Unprotected on purpose: callers decide about locking. */
  async sell(sku: string, quantity: number): Promise<PurchaseResult> {
    const available = await this.stock(sku);
    if (available < quantity)
      throw new UnprocessableEntityException(`Only ${available} of ${sku} left`);
    if (this.config.paymentDelay > 0) await sleep(this.config.paymentDelay); // authorise the payment
    const remaining = available - quantity;
    await this.redis.client.set(stockKey(sku), remaining);
    return { sku, quantity, remaining, fence: getCurrentLock()?.fence };
  }

  /**
   * A locked provider method, callable from anywhere in code (the HTTP controller, the
   * microservice handler, a job). Called from a handler that already holds `sku:<sku>`, it
   * re-enters that lock instead of waiting for itself.
   */
  @WithLock({ key: (sku: string) => `sku:${sku}` })
  async purchase(sku: string, quantity: number): Promise<PurchaseResult> {
    return this.sell(sku, quantity);
  }

  @WithLock({ key: 'sku:{0}' })
  async restock(sku: string, quantity: number): Promise<number> {
    const current = Number((await this.redis.client.get(stockKey(sku))) ?? 0);
    await this.redis.client.set(stockKey(sku), current + quantity);
    return current + quantity;
  }

  /**
   * Moves stock from one SKU to another (a relabel, a bundle split) under the locks of both:
   * taken together, all or none, in one order whichever way the move goes, so a move A→B and a
   * move B→A never deadlock, and no purchase of either SKU runs meanwhile.
   */
  @WithLock({ key: ['sku:{0}', 'sku:{1}'] })
  async move(from: string, to: string, quantity: number): Promise<MoveResult> {
    return this.moveStock(from, to, quantity);
  }

  /** The move itself, read-modify-write on both SKUs. Unprotected on purpose, like `sell`. */
  async moveStock(from: string, to: string, quantity: number): Promise<MoveResult> {
    const [available, target] = await Promise.all([this.stock(from), this.stock(to)]);
    if (available < quantity)
      throw new UnprocessableEntityException(`Only ${available} of ${from} left`);
    if (this.config.paymentDelay > 0) await sleep(this.config.paymentDelay); // count the shelf
    await Promise.all([
      this.redis.client.set(stockKey(from), available - quantity),
      this.redis.client.set(stockKey(to), target + quantity),
    ]);
    return {
      from,
      to,
      quantity,
      remaining: { [from]: available - quantity, [to]: target + quantity },
      fences: getCurrentLock()?.fences ?? {},
    };
  }

  async setStock(sku: string, quantity: number): Promise<void> {
    await this.redis.client.set(stockKey(sku), quantity);
  }

  async skus(): Promise<string[]> {
    const keys = await this.redis.client.keys(stockKey('*'));
    return keys.map((key) => key.slice(stockKey('').length)).sort();
  }
}

/**
 * Where a SKU's stock lives. The store reads SKUs without regard to case, as many databases do, so
 * `WIDGET` and `widget` are one product: the routes' lock keys must be too (see `SkuPipe`).
 */
export const stockKey = (sku: string): string => `sample:stock:${sku.toLowerCase()}`;
const sleep = (ms: number): Promise<void> => new Promise((resolve) => setTimeout(resolve, ms));
