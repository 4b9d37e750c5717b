import { Inject, Injectable, Logger, type OnApplicationBootstrap } from '@nestjs/common';
import { Cron, SchedulerRegistry } from '@nestjs/schedule';
import { getCurrentLock, WithLock } from '../../lib/index.js';
import { InventoryService } from '../inventory/inventory.service.js';
import { RedisConnection } from '../redis.provider.js';
import { SampleConfig } from '../sample.config.js';

const STOCK_REPORT = 'stock-report';

/**
 * A scheduled job that every instance of the app runs on the same `@Cron`, but only one should
 * run per fire: `onBusy: 'skip'` skips the fire where another instance has the lock (no error, a
 * debug line), and `holdAtLeast` keeps the key taken for 5 s after even a quick run (with a TTL of
 * its own: the chaos workers run this app with 1 s locks, which the boot check refuses), so an
 * instance whose clock or timer is a few seconds behind does not run the same fire again.
 */
@Injectable()
export class StockReportJob implements OnApplicationBootstrap {
  private readonly logger = new Logger(StockReportJob.name);

  constructor(
    @Inject(InventoryService) private readonly inventory: InventoryService,
    @Inject(RedisConnection) private readonly redis: RedisConnection,
    @Inject(SampleConfig) private readonly config: SampleConfig,
    @Inject(SchedulerRegistry) private readonly scheduler: SchedulerRegistry,
  ) {}

  /** Registered stopped (`disabled`), started here unless the app runs with `REPORTS=off`. */
  onApplicationBootstrap(): void {
    if (this.config.reports) this.scheduler.getCronJob(STOCK_REPORT).start();
  }

  /** Writes a stock report: `true`, or `undefined` when another instance has this fire. */
  @Cron('*/30 * * * * *', { name: STOCK_REPORT, disabled: true })
  @WithLock({ key: 'job:stock-report', onBusy: 'skip', ttl: 10_000, holdAtLeast: 5_000 })
  async run(): Promise<true | undefined> {
    const lock = getCurrentLock()!;
    const report: Record<string, number> = {};
    for (const sku of await this.inventory.skus()) {
      lock.signal.throwIfAborted(); // lost the lock: another instance may be writing now
      report[sku] = await this.inventory.stock(sku);
    }
    const entry = { at: new Date().toISOString(), fence: lock.fence, report };
    await this.redis.client.set('sample:report:stock', JSON.stringify(entry));
    this.logger.log(
      `Stock report written (fence ${lock.fence}, ${Object.keys(report).length} SKUs)`,
    );
    return true;
  }
}
