/** The README's recipes, run as written against real Redis. */
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import { Module } from '@nestjs/common';
import { Test } from '@nestjs/testing';
import { getRedisConnectionToken, RedisModule } from '@nestjs-modules/ioredis';
import type { Redis } from 'ioredis';
import { LockService, RedisLockModule } from '../../lib/index.js';
import { uniqueKey } from '../support/lock-module.js';
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
