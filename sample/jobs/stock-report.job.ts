import {
  Inject,
  Injectable,
  Logger,
  type OnApplicationBootstrap,
  type OnModuleDestroy,
} from '@nestjs/common';
import { getCurrentLock, WithLock } from '../../lib/index.js';
import { RedisConnection } from '../redis.provider.js';
import { SampleConfig } from '../sample.config.js';
import { InventoryService } from './inventory.service.js';

/**
 * A periodic job that every instance of the app schedules, but only one should run per turn:
 * `onBusy: 'skip'` skips the turn where another instance has the lock, and `holdAtLeast` keeps
 * the key taken for a second after even a quick run, so an instance whose timer fires a moment
 * later does not run the same turn again.
 */
@Injectable()
export class StockReportJob implements OnApplicationBootstrap, OnModuleDestroy {
  private readonly logger = new Logger(StockReportJob.name);
  private timer: NodeJS.Timeout | undefined;

  constructor(
    @Inject(InventoryService) private readonly inventory: InventoryService,
    @Inject(RedisConnection) private readonly redis: RedisConnection,
    @Inject(SampleConfig) private readonly config: SampleConfig,
  ) {}

  onApplicationBootstrap(): void {
    if (this.config.reportInterval > 0) {
      this.timer = setInterval(() => {
        this.run().catch((error: unknown) =>
          this.logger.warn(`Stock report failed: ${String(error)}`),
        );
      }, this.config.reportInterval);
    }
  }

  onModuleDestroy(): void {
    clearInterval(this.timer);
  }

  /** Writes a stock report: `true`, or `undefined` when another instance has this turn. */
  @WithLock({ key: 'job:stock-report', onBusy: 'skip', holdAtLeast: 1_000 })
  async run(): Promise<true | undefined> {
    const lock = getCurrentLock()!;
    const report: Record<string, number> = {};
    for (const sku of await this.inventory.skus()) {
      lock.signal.throwIfAborted(); // lost the lock: another instance may be writing now
      report[sku] = await this.inventory.stock(sku);
    }
    const entry = { at: new Date().toISOString(), fence: lock.fence, report };
    await this.redis.client.set('sample:report:stock', JSON.stringify(entry));
    return true;
  }
}
