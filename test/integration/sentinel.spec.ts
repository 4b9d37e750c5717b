import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import { Redis } from 'ioredis';
import {
  sleep,
  startLockModule,
  uniqueKey,
  type LockModuleFixture,
} from '../support/lock-module.js';
import { startRedis, startSentinel, type RedisServer } from '../support/redis-server.js';

describe('through Sentinel', () => {
  let master: RedisServer;
  let sentinel: RedisServer;
  let app: LockModuleFixture;
  let other: LockModuleFixture;

  before(async () => {
    master = await startRedis();
    sentinel = await startSentinel(master);
    const connection = {
      sentinels: [{ host: sentinel.host, port: sentinel.port }],
      name: 'mymaster',
    };
    app = await startLockModule({ connection });
    other = await startLockModule({ connection });
  });
  after(async () => {
    await app?.close();
    await other?.close();
    await sentinel?.stop();
    await master?.stop();
  });

  it('locks on the master that Sentinel names, and wakes waiters on release', async () => {
    const key = uniqueKey();
    const lock = await app.locks.acquire(key);
    const direct = new Redis(master.port, master.host);
    try {
      assert.equal(await direct.get(`lock:{${key}}`), lock.token);
    } finally {
      direct.disconnect();
    }
    const waiting = other.locks.acquire(key, { acquireTimeout: 5_000 });
    await sleep(100);
    const releasedAt = performance.now();
    await lock.release();
    const next = await waiting;
    assert.ok(performance.now() - releasedAt < 100);
    assert.ok(next.fence > lock.fence);
    await next.release();
  });
});
