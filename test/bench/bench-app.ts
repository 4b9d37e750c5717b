/**
 * Workload 5's server: the sample app (its AppModule, as `npm run sample` runs it) on a free
 * loopback port, with no payment delay and no report job, so that a request costs what the
 * framework, Redis and the lock cost. Stocks SKUs `d0`…`d999` (distinct keys) and `hot` plenty.
 * Adds one route of its own, `POST /products/:sku/purchase-minimum`: the same purchase under the
 * benchmark's hand-written minimum lock (`SET NX PX`, 10 ms poll, compare-and-delete), the floor
 * that `@WithLock`'s added latency is read against; and `POST /products/:sku/purchase-once`: the
 * same purchase under one `@WithLock` on the handler (the sample's route locks twice: its handler,
 * and the provider method it calls, which re-enters), so that the report tells one lock's cost
 * from the re-entry's.
 * Prints `{"port": N}` once listening; stops when its stdin closes.
 *
 * Usage: node bench-app.js <redis port>
 */
import 'reflect-metadata';
import { Body, Controller, Inject, Module, Param, Post, type OnModuleInit } from '@nestjs/common';
import { NestFactory } from '@nestjs/core';
import { Redis } from 'ioredis';
import { WithLock } from '../../lib/index.js';
import { CONTENDERS, type Locker } from './contenders.js';

const redisPort = Number(process.argv[2]);
Object.assign(process.env, {
  REDIS_URL: `redis://127.0.0.1:${redisPort}`,
  PAYMENT_DELAY: '0',
  REPORTS: 'off',
  LOCK_WAIT: '30000',
});
// After the environment is set: SampleConfig reads it when the app is created.
const { AppModule } = await import('../../sample/app.module.js');
const { InventoryService, stockKey } = await import('../../sample/inventory/inventory.service.js');
const { RedisConnection } = await import('../../sample/redis.provider.js');
const { PurchasePipe } = await import('../../sample/inventory/purchase.dto.js');

/** The sample's purchase under the hand-written minimum lock, on the app's own connection. */
@Controller('products')
class MinimumLockController implements OnModuleInit {
  private lock!: Locker;

  constructor(
    @Inject(InventoryService) private readonly inventory: InstanceType<typeof InventoryService>,
    @Inject(RedisConnection) private readonly redis: InstanceType<typeof RedisConnection>,
  ) {}

  async onModuleInit(): Promise<void> {
    this.lock = await CONTENDERS[0].create({
      client: this.redis.client,
      nodes: [this.redis.client],
    });
  }

  @Post(':sku/purchase-minimum')
  async purchase(
    @Param('sku') sku: string,
    @Body(PurchasePipe) body: { quantity: number },
  ): Promise<unknown> {
    const held = await this.lock.acquire(`sku:${sku}`, 10_000, 30_000);
    try {
      return await this.inventory.sell(sku, body.quantity);
    } finally {
      await held.release();
    }
  }

  @Post(':sku/purchase-once')
  @WithLock({ key: 'sku:{0}' })
  purchaseOnce(
    @Param('sku') sku: string,
    @Body(PurchasePipe) body: { quantity: number },
  ): Promise<unknown> {
    return this.inventory.sell(sku, body.quantity);
  }
}

@Module({
  imports: [AppModule],
  controllers: [MinimumLockController],
  providers: [InventoryService],
})
class BenchAppModule {}

const stock = new Redis(redisPort, '127.0.0.1');
await stock.mset(
  Object.fromEntries(
    [...Array.from({ length: 1_000 }, (_, i) => `d${i}`), 'hot'].map((sku) => [
      stockKey(sku),
      1_000_000_000,
    ]),
  ),
);
stock.disconnect();

const app = await NestFactory.create(BenchAppModule, { logger: false });
await app.listen(0, '127.0.0.1');
const address = app.getHttpServer().address() as { port: number };
process.stdout.write(`${JSON.stringify({ port: address.port })}\n`);
process.stdin.resume();
process.stdin.once('end', () => void app.close());
