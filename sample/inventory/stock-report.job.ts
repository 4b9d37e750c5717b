import {
  Inject,
  Injectable,
  Logger,
  type OnApplicationBootstrap,
  type OnModuleDestroy,
} from '@nestjs/common';
import { LockAcquireTimeoutError, LockService } from '../../lib/index.js';
import { RedisConnection } from '../redis.provider.js';
import { SampleConfig } from '../sample.config.js';
import { InventoryService } from './inventory.service.js';

/**
 * A periodic job that every instance of the app schedules, but only one should run at a time:
 * it takes the lock with LockService.using() and skips its turn when another instance has it.
 */
@Injectable()
export class StockReportJob implements OnApplicationBootstrap, OnModuleDestroy {
  private readonly logger = new Logger(StockReportJob.name);
  private timer: NodeJS.Timeout | undefined;

  constructor(
    @Inject(LockService) private readonly locks: LockService,
    @Inject(InventoryService) private readonly inventory: InventoryService,
    @Inject(RedisConnection) private readonly redis: RedisConnection,
    @Inject(SampleConfig) private readonly config: SampleConfig,
  ) {}

  onApplicationBootstrap(): void {
    if (this.config.reportInterval > 0) {
      this.timer = setInterval(() => void this.run(), this.config.reportInterval);
    }
  }

  onModuleDestroy(): void {
    clearInterval(this.timer);
  }

  /** Writes a stock report unless another instance is writing one; returns whether it ran. */
  async run(): Promise<boolean> {
    try {
      await this.locks.using(
        'job:stock-report',
        async (lock) => {
          const report: Record<string, number> = {};
          for (const sku of await this.inventory.skus()) {
            lock.signal.throwIfAborted(); // lost the lock: another instance may be writing now
            report[sku] = await this.inventory.stock(sku);
          }
          const entry = { at: new Date().toISOString(), fence: lock.fence, report };
          await this.redis.client.set('sample:report:stock', JSON.stringify(entry));
        },
        { acquireTimeout: 0 }, // one attempt: if another instance has it, skip this turn
      );
      return true;
    } catch (error) {
      if (error instanceof LockAcquireTimeoutError) return false;
      this.logger.warn(`Stock report failed: ${String(error)}`);
      return false;
    }
  }
}
