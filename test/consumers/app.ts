/**
 * A consumer app, compiled and run against the packed tarball (not the source tree) by
 * scripts/test-consumers.sh: once as a NestJS 12 ES module app with ioredis 6, once as a
 * NestJS 11 CommonJS app with ioredis 5 (compiled as the Nest 11 CLI scaffolds it). It boots,
 * locks through LockService and through @WithLock on a route and on a provider, gets the 409,
 * and shuts down without closing the ioredis client it gave the module; then the provider runs on
 * `nestjs-redis-lock/testing` (no Redis). Exits 0 when all holds.
 */
import 'reflect-metadata';
import { Controller, Get, Injectable, Module, Param } from '@nestjs/common';
import { NestFactory } from '@nestjs/core';
import { Redis } from 'ioredis';
import { LockAcquireTimeoutError, LockService, RedisLockModule, WithLock } from 'nestjs-redis-lock';
import { RedisLockHealthIndicator } from 'nestjs-redis-lock/health';
import { RedisLockTestingModule } from 'nestjs-redis-lock/testing';
import { TerminusModule } from '@nestjs/terminus';

const sleep = (ms: number): Promise<void> => new Promise((resolve) => setTimeout(resolve, ms));
const check = (ok: boolean, what: string): void => {
  if (!ok) throw new Error(`consumer check failed: ${what}`);
  console.log(`ok - ${what}`);
};

@Injectable()
class Jobs {
  @WithLock('job:{0}', 5_000, 0)
  async run(id: string): Promise<string> {
    await sleep(200);
    return `ran ${id}`;
  }
}

@Controller('orders')
class OrdersController {
  constructor(private readonly jobs: Jobs) {}

  @Get(':id/pay')
  @WithLock({ key: 'order:{0}', acquireTimeout: 0 })
  async pay(@Param('id') id: string): Promise<{ paid: string }> {
    await sleep(200);
    return { paid: id };
  }

  @Get(':id/job')
  job(@Param('id') id: string): Promise<string> {
    return this.jobs.run(id);
  }
}

const client = new Redis(process.env.REDIS_URL ?? 'redis://127.0.0.1:6379');

@Module({
  imports: [
    // The consumer apps run side by side on one Redis: each locks its own keys.
    RedisLockModule.forRoot({ client, keyPrefix: `consumer-${process.pid}:`, isGlobal: true }),
    TerminusModule,
  ],
  controllers: [OrdersController],
  providers: [Jobs, RedisLockHealthIndicator],
})
class AppModule {}

/** The same provider on `nestjs-redis-lock/testing`: no Redis. */
@Module({ imports: [RedisLockTestingModule.forRoot({ isGlobal: true })], providers: [Jobs] })
class TestingModule {}

async function main(): Promise<void> {
  const app = await NestFactory.create(AppModule, { logger: false });
  await app.listen(0, '127.0.0.1');
  const url = (await app.getUrl()).replace('[::1]', '127.0.0.1');
  const locks = app.get(LockService);
  const health = await app.get(RedisLockHealthIndicator).isHealthy('locks');
  check(health.locks?.status === 'up', 'nestjs-redis-lock/health reports up through Terminus');

  const result = await locks.using('consumer:using', async (lock) => lock.fence);
  check(result > 0, 'LockService.using() runs the work with a fence');
  const held = await locks.acquire('busy');
  await locks.acquire('busy', { acquireTimeout: 50 }).then(
    () => check(false, 'a held lock is refused'),
    (error: unknown) => check(error instanceof LockAcquireTimeoutError, 'a held lock is refused'),
  );
  await held.release();

  const route = await Promise.all([fetch(`${url}/orders/1/pay`), fetch(`${url}/orders/1/pay`)]);
  const statuses = route.map((response) => response.status).sort();
  check(
    statuses.join() === '200,409',
    `@WithLock on a route: one 200, one 409 (${statuses.join()})`,
  );
  check(
    route.some((response) => response.headers.has('retry-after')),
    'the 409 has Retry-After',
  );

  // A provider method called from code: the second caller gets the typed error.
  const jobs = app.get(Jobs);
  const runs = await Promise.allSettled([jobs.run('2'), jobs.run('2')]);
  check(
    runs.some((run) => run.status === 'fulfilled' && run.value === 'ran 2') &&
      runs.some(
        (run) => run.status === 'rejected' && run.reason instanceof LockAcquireTimeoutError,
      ),
    '@WithLock on a provider method: one runs, one LockAcquireTimeoutError',
  );

  await app.close();
  check(
    client.status === 'ready' && (await client.ping()) === 'PONG',
    'the given client stays open',
  );

  const testing = await NestFactory.createApplicationContext(TestingModule, { logger: false });
  const inMemory = await Promise.allSettled([
    testing.get(Jobs).run('3'),
    testing.get(Jobs).run('3'),
  ]);
  check(
    inMemory.some((run) => run.status === 'fulfilled' && run.value === 'ran 3') &&
      inMemory.some(
        (run) => run.status === 'rejected' && run.reason instanceof LockAcquireTimeoutError,
      ),
    'nestjs-redis-lock/testing: the same @WithLock, locks in memory',
  );
  await testing.close();
  await client.quit();
}

main().catch((error: unknown) => {
  console.error(error);
  process.exit(1);
});
