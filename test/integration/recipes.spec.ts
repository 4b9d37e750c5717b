/** The README's recipes, run as written against real Redis. */
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import { mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { Controller, Module, Param, Post, type Type } from '@nestjs/common';
import { APP_FILTER } from '@nestjs/core';
import ts from 'typescript';
import { Test } from '@nestjs/testing';
import { getRedisConnectionToken, RedisModule } from '@nestjs-modules/ioredis';
import type { Redis } from 'ioredis';
import { LockService, RedisLockModule } from '../../lib/index.js';
import { FaultProxy } from '../support/fault-proxy.js';
import { assertWithin, watchStalls } from '../support/timing.js';
import { LogCapture, startHttpApp, uniqueKey } from '../support/lock-module.js';
import { startRedis, type RedisServer } from '../support/redis-server.js';

describe('recipe: the client of @nestjs-modules/ioredis', () => {
  let server: RedisServer;

  before(async () => {
    server = await startRedis();
  });
  after(async () => {
    await server?.stop();
  });

  it('forRootAsync({ inject, useFactory }) locks on that client and never closes it', async () => {
    @Module({
      imports: [
        RedisModule.forRoot({ type: 'single', url: server.url }),
        RedisLockModule.forRootAsync({
          inject: [getRedisConnectionToken()],
          useFactory: (redis: Redis) => ({ client: redis }),
        }),
      ],
    })
    class AppModule {}

    const module = await Test.createTestingModule({ imports: [AppModule] }).compile();
    await module.init();
    const redis = module.get<Redis>(getRedisConnectionToken());
    const locks = module.get(LockService);
    const key = uniqueKey();
    await locks.using(key, async (lock) => {
      assert.equal(await redis.get(`lock:{${key}}`), lock.token, 'the lock is on that client');
    });
    // The lock module's own shutdown leaves the client alone; @nestjs-modules/ioredis closes it.
    await locks.onApplicationShutdown();
    assert.equal(redis.status, 'ready');
    assert.equal(await redis.ping(), 'PONG');
    await module.close();
  });
});

/**
 * The exception filter of docs/errors.md, taken from the guide as printed (transpiled as a user's
 * build would), answering `using()`'s lock errors in a route as `@WithLock` does.
 */
describe('recipe: the LockErrorsFilter of the errors guide', () => {
  @Controller('orders')
  class ShipController {
    constructor(private readonly locks: LockService) {}

    @Post(':id/ship')
    ship(@Param('id') id: string) {
      return this.locks.using(`order:${id}`, async () => ({ shipped: id }), {
        acquireTimeout: 100,
      });
    }
  }

  it('busy: 409 with Retry-After; Redis out of reach: 503, within commandTimeout', async () => {
    const { LockErrorsFilter } = (await fromGuide('docs/errors.md', 'class LockErrorsFilter')) as {
      LockErrorsFilter: Type;
    };
    const server = await startRedis();
    const proxy = await FaultProxy.start(() => server.port);
    const { app, locks, url } = await startHttpApp(
      { connection: `redis://127.0.0.1:${proxy.port}`, commandTimeout: 300 },
      {
        controllers: [ShipController],
        providers: [{ provide: APP_FILTER, useClass: LockErrorsFilter }],
      },
      new LogCapture(),
    );
    try {
      const id = uniqueKey();
      assert.equal((await fetch(`${url}/orders/${id}/ship`, { method: 'POST' })).status, 201);
      const held = await locks.acquire(`order:${id}`, { ttl: 5_000 });
      try {
        const busy = await fetch(`${url}/orders/${id}/ship`, { method: 'POST' });
        assert.equal(busy.status, 409);
        assert.equal(busy.headers.get('retry-after'), '1', 'the route holds the key for ms');
        const { message } = (await busy.json()) as { message: string };
        assert.equal(message, 'The resource is busy; retry later.');
        assert.ok(!message.includes(String(id)), 'the key, from the request, is not echoed');
      } finally {
        await held.release();
      }
      proxy.stall();
      const watch = watchStalls();
      const started = performance.now();
      const out = await fetch(`${url}/orders/${id}/ship`, { method: 'POST' });
      assert.equal(out.status, 503);
      assertWithin(performance.now() - started, 300, watch, 'the 503 with Redis out of reach');
      watch.stop();
      assert.equal(
        ((await out.json()) as { message: string }).message,
        'The lock service is unavailable; retry later.',
      );
    } finally {
      proxy.heal();
      await app.close();
      await proxy.close();
      await server.stop();
    }
  });
});

/** The module a guide's TypeScript block makes, transpiled as printed, the package resolved here. */
async function fromGuide(page: string, marker: string): Promise<Record<string, unknown>> {
  const root = fileURLToPath(new URL('../../../', import.meta.url));
  const text = readFileSync(join(root, page), 'utf8');
  const block = [...text.matchAll(/```ts\n([\s\S]*?)```/g)]
    .map((match) => match[1])
    .find((code) => code.includes(marker));
  assert.ok(block, `no block with ${marker} in ${page}`);
  const library = new URL('../../lib/index.js', import.meta.url).href;
  const { outputText } = ts.transpileModule(
    block.replaceAll("'nestjs-redis-lock'", `'${library}'`),
    {
      compilerOptions: {
        module: ts.ModuleKind.ES2022,
        target: ts.ScriptTarget.ES2022,
        experimentalDecorators: true,
        emitDecoratorMetadata: true,
      },
    },
  );
  const file = join(root, 'build', 'recipes', `${marker.replace(/\W+/g, '-')}.mjs`);
  mkdirSync(dirname(file), { recursive: true });
  writeFileSync(file, outputText);
  return (await import(pathToFileURL(file).href)) as Record<string, unknown>;
}
