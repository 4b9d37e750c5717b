/**
 * Workload 5's server: the sample app (its AppModule, as `npm run sample` runs it) on a free
 * loopback port, with no payment delay and no report job, so that a request costs what the
 * framework, Redis and the lock cost. Stocks SKUs `d0`…`d999` (distinct keys) and `hot` plenty.
 * Prints `{"port": N}` once listening; stops when its stdin closes.
 *
 * Usage: node bench-app.js <redis port>
 */
import 'reflect-metadata';
import { NestFactory } from '@nestjs/core';
import { Redis } from 'ioredis';

const redisPort = Number(process.argv[2]);
Object.assign(process.env, {
  REDIS_URL: `redis://127.0.0.1:${redisPort}`,
  PAYMENT_DELAY: '0',
  REPORT_INTERVAL: '0',
  LOCK_WAIT: '30000',
});
// After the environment is set: SampleConfig reads it when the app is created.
const { AppModule } = await import('../../sample/app.module.js');
const { stockKey } = await import('../../sample/inventory/inventory.service.js');

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

const app = await NestFactory.create(AppModule, { logger: false });
await app.listen(0, '127.0.0.1');
const address = app.getHttpServer().address() as { port: number };
process.stdout.write(`${JSON.stringify({ port: address.port })}\n`);
process.stdin.resume();
process.stdin.once('end', () => void app.close());
