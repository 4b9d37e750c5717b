import { Inject, Injectable, Logger } from '@nestjs/common';
import { setTimeout as sleep } from 'node:timers/promises';
import { WhileLeader, type LeaderTerm } from '../../lib/index.js';
import { InventoryService } from '../inventory/inventory.service.js';
import { RedisConnection } from '../redis.provider.js';
import { SampleConfig } from '../sample.config.js';

/**
 * Writes the low-stock alert, but only if no later term wrote before: the resource's own guard
 * against a leader that lost its lock without knowing (frozen, cut off). 1 written, 0 refused.
 */
const FENCED_SET = `
local highest = tonumber(redis.call('HGET', KEYS[1], 'term') or '0')
if tonumber(ARGV[1]) < highest then return 0 end
redis.call('HSET', KEYS[1], 'term', ARGV[1], 'alert', ARGV[2])
return 1`;

/**
 * A singleton worker: one instance of the app at a time watches for SKUs running low, for as long
 * as it leads `leader:low-stock`. Another takes over within the TTL when the leader dies, at once
 * when it shuts down. Each write carries the term number (the lock's fence), and the alert key
 * refuses a term older than the last one that wrote.
 */
@Injectable()
export class LowStockMonitor {
  private readonly logger = new Logger(LowStockMonitor.name);

  constructor(
    @Inject(InventoryService) private readonly inventory: InventoryService,
    @Inject(RedisConnection) private readonly redis: RedisConnection,
    @Inject(SampleConfig) private readonly config: SampleConfig,
  ) {}

  @WhileLeader('leader:low-stock', { ttl: 10_000 })
  async watch({ fence, signal }: LeaderTerm): Promise<void> {
    this.logger.log(`Leading low-stock monitoring (term ${fence})`);
    while (!signal.aborted) {
      const low: string[] = [];
      for (const sku of await this.inventory.skus()) {
        if ((await this.inventory.stock(sku)) < this.config.lowStock) low.push(sku);
      }
      const alert = JSON.stringify({ at: new Date().toISOString(), low });
      const written = await this.redis.client.eval(
        FENCED_SET,
        1,
        'sample:alerts:low-stock',
        fence,
        alert,
      );
      if (written === 0) break; // a later leader has written: this term is over
      await sleep(this.config.monitorInterval, undefined, { signal }).catch(() => undefined);
    }
    this.logger.log(
      `Stopped leading low-stock monitoring (term ${fence}): ${String(signal.reason ?? 'outdated')}`,
    );
  }
}
