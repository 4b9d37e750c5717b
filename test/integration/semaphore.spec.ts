import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { Injectable, Module } from '@nestjs/common';
import { Test } from '@nestjs/testing';
import {
  LockAcquireTimeoutError,
  LockArgumentError,
  LockLostError,
  LockService,
  RedisLockConfigurationError,
  RedisLockModule,
  WithLock,
  type Lock,
} from '../../lib/index.js';
import {
  assertOwnTokenKeepsFence,
  eventually,
  sleep,
  startNonPollingApp,
  twoAppsOnOneRedis,
  uniqueKey,
  waitingCallers,
} from '../support/lock-module.js';
import { monitorRedis } from '../support/redis-monitor.js';
import { assertWithin, watchStalls } from '../support/timing.js';

let exportsInside = 0;
let exportsPeak = 0;

@Injectable()
class ExportJobs {
  /** At most two exports at once, across every instance. */
  @WithLock({ key: 'exports', limit: 2, acquireTimeout: 5_000 })
  async run(): Promise<number> {
    exportsPeak = Math.max(exportsPeak, ++exportsInside);
    await sleep(30);
    exportsInside--;
    return exportsPeak;
  }
}

describe('counting semaphores (limit)', () => {
  const env = twoAppsOnOneRedis({ fenceRetention: 0 });

  /**
   * Watches the attempts on `key`: `asleep(n)` resolves once `n` waiters that came after it
   * started have each made their two attempts (the first, and the one right after subscribing):
   * from then on only a release wakes them (their app never polls within the test).
   */
  async function attemptsOn(
    key: string,
  ): Promise<{ asleep(n: number): Promise<void>; stop(): void }> {
    const monitor = await monitorRedis(env.server.port);
    const attempts = (): number =>
      monitor.commands.filter(({ args }) => args[0] === 'evalsha' && args[3] === `lock:{${key}}`)
        .length;
    return {
      asleep: async (n) => {
        assert.ok(await eventually(() => attempts() >= 2 * n), `${attempts()} attempts`);
      },
      stop: () => monitor.stop(),
    };
  }

  /** Tracks whether `pending` has settled yet. */
  const settledFlag = (pending: Promise<unknown>): { settled: boolean } => {
    const flag = { settled: false };
    pending.then(
      () => (flag.settled = true),
      () => (flag.settled = true),
    );
    return flag;
  };

  it("re-acquiring with the caller's own token that holds a place returns the same fence; a new place a new one", async () => {
    await assertOwnTokenKeepsFence(env, { limit: 2 });
  });

  describe('mixed limits in one process: each caller is admitted while fewer than its own limit hold the key', () => {
    it('a caller whose limit has room is not queued behind a waiter whose limit has none', async () => {
      const key = uniqueKey('mixed');
      const app = await startNonPollingApp({ connection: env.server.url, fenceRetention: 0 });
      try {
        const held = [
          await env.other.locks.acquire(key, { limit: 2, ttl: 30_000 }),
          await env.other.locks.acquire(key, { limit: 2, ttl: 30_000 }),
        ];
        const watch = await attemptsOn(key);
        const two = app.locks.acquire(key, { limit: 2, acquireTimeout: 10_000 });
        const twoFlag = settledFlag(two);
        await watch.asleep(1);
        watch.stop();
        // A third place is free for limit 3: got at once, not after the limit-2 waiter gives up
        // at 10 s (nor at its own deadline, 20 s).
        const three = await app.locks.acquire(key, { limit: 3, acquireTimeout: 20_000 });
        assert.equal(twoFlag.settled, false, 'the limit-3 caller waited for the limit-2 waiter');
        await three.release();
        for (const lock of held) await lock.release();
        await (await two).release();
      } finally {
        await app.close();
      }
    });

    it('a release that wakes a waiter whose limit has no room wakes the next, whose limit has', async () => {
      const key = uniqueKey('mixed');
      const app = await startNonPollingApp({ connection: env.server.url, fenceRetention: 0 });
      try {
        const held = await Promise.all(
          [0, 1, 2].map(() => env.other.locks.acquire(key, { limit: 3, ttl: 30_000 })),
        );
        const watch = await attemptsOn(key);
        const two = app.locks.acquire(key, { limit: 2, acquireTimeout: 10_000 });
        const twoFlag = settledFlag(two);
        await watch.asleep(1);
        const three = app.locks.acquire(key, { limit: 3, acquireTimeout: 20_000 });
        await watch.asleep(2); // both asleep: their next polls are past their deadlines
        watch.stop();
        // 2 left: no room for limit 2, room for limit 3.
        await held[0].release();
        const third = await three;
        assert.equal(twoFlag.settled, false, 'the limit-3 waiter slept until the limit-2 one left');
        await third.release();
        for (const lock of held.slice(1)) await lock.release();
        await (await two).release();
      } finally {
        await app.close();
      }
    });
  });

  it('admits `limit` holders, each with its own token and a greater fence; the next waits until one leaves', async () => {
    const key = uniqueKey('pool');
    const holders: Lock[] = [];
    for (const service of [env.locks, env.other.locks, env.locks]) {
      holders.push(await service.acquire(key, { limit: 3, ttl: 10_000 }));
    }
    assert.equal(new Set(holders.map((lock) => lock.token)).size, 3);
    for (let i = 1; i < 3; i++) assert.ok(holders[i].fence > holders[i - 1].fence);
    assert.equal(await env.other.locks.tryAcquire(key, { limit: 3 }), null, 'full');
    assert.equal(await env.locks.isLocked(key), true);

    const waiter = await startNonPollingApp({ connection: env.server.url, fenceRetention: 0 });
    try {
      const waiting = waiter.locks.acquire(key, { limit: 3, acquireTimeout: 5_000 });
      assert.ok(await eventually(() => waitingCallers(waiter.locks, key) === 1), 'it waits');
      assert.equal(await holders[1].release(), true);
      const fourth = await waiting; // woken by the release: its next poll is 60 s away
      assert.ok(fourth.fence > holders[2].fence);
      assert.equal(await holders[1].release(), false, 'a place is given back once');
      for (const lock of [holders[0], holders[2], fourth]) assert.equal(await lock.release(), true);
    } finally {
      await waiter.close();
    }
    assert.equal(await env.locks.isLocked(key), false);
    assert.equal(await env.redis.keys(`lock:{${key}}*`).then((keys) => keys.length), 0);
  });

  it('never more than `limit` at once under load, and the limit is reached (control: without it, more run at once)', async () => {
    const key = uniqueKey('pool');
    let inside = 0;
    let peak = 0;
    const work = async (): Promise<void> => {
      peak = Math.max(peak, ++inside);
      await sleep(5);
      inside--;
    };
    await Promise.all(
      Array.from({ length: 30 }, (_, i) =>
        (i % 2 ? env.locks : env.other.locks).using(key, work, {
          limit: 3,
          acquireTimeout: 10_000,
        }),
      ),
    );
    assert.equal(peak, 3);
    peak = 0;
    await Promise.all(Array.from({ length: 30 }, work));
    assert.ok(peak > 3, `control peak ${peak}`);
  });

  it('a crashed holder’s place frees itself after its TTL, not before (Redis’s clock, no client clocks)', async () => {
    const key = uniqueKey('pool');
    const watch = watchStalls();
    const calledAt = performance.now();
    const abandoned = await env.other.locks.acquire(key, { limit: 2, ttl: 600 });
    const kept = await env.locks.acquire(key, { limit: 2, ttl: 10_000 });
    assert.equal(await env.locks.tryAcquire(key, { limit: 2 }), null);
    const next = await env.locks.acquire(key, { limit: 2, acquireTimeout: 3_000 });
    // Redis counted the place's TTL from after `calledAt`; the waiter tries again by the time
    // it ends, or at its next poll (retryInterval 1 s + 50 ms of jitter).
    const after = performance.now() - calledAt;
    assert.ok(after >= 599, `freed after ${after.toFixed(0)} ms`);
    assertWithin(after, 600 + 1_050, watch, 'the wait for the crashed holder’s place');
    watch.stop();
    assert.equal(await abandoned.release(), false);
    await Promise.all([kept.release(), next.release()]);
  });

  it('auto-extends in using(), aborts the signal when its place is gone, and extend() never takes a lapsed place back', async () => {
    const key = uniqueKey('pool');
    await env.locks.using(
      key,
      async (lock) => {
        await sleep(700);
        assert.equal(lock.signal.aborted, false);
        assert.ok((await env.redis.zscore(`lock:{${key}}`, lock.token)) !== null);
      },
      { limit: 2, ttl: 300 },
    );
    const lock = await env.locks.acquire(key, { limit: 2, ttl: 10_000 });
    await env.redis.zrem(`lock:{${key}}`, lock.token); // lost, as an eviction or a failover loses it
    const error = await lock.extend().catch((e: unknown) => e);
    assert.ok(error instanceof LockLostError && error.reason === 'not-held', String(error));
    assert.equal(lock.signal.aborted, true);
    assert.equal(await env.redis.zscore(`lock:{${key}}`, lock.token), null);
  });

  it('times out with LockAcquireTimeoutError (and retryAfterMs) while full; every key keeps a TTL', async () => {
    const key = uniqueKey('pool');
    const held = await Promise.all(
      [1, 2].map(() => env.locks.acquire(key, { limit: 2, ttl: 5_000 })),
    );
    const error = await env.other.locks
      .acquire(key, { limit: 2, acquireTimeout: 200 })
      .catch((e: unknown) => e);
    assert.ok(error instanceof LockAcquireTimeoutError, String(error));
    assert.ok(error.retryAfterMs! > 4_000 && error.retryAfterMs! <= 5_000);
    for (const name of await env.redis.keys(`lock:{${key}}*`))
      assert.ok((await env.redis.pttl(name)) > 0);
    await Promise.all(held.map((lock) => lock.release()));
  });

  it('callers that disagree on the limit are each admitted while fewer than their own limit hold it; a plain lock excludes every semaphore caller and the other way round', async () => {
    const key = uniqueKey('pool');
    const two = await Promise.all([1, 2].map(() => env.locks.acquire(key, { limit: 2 })));
    assert.equal(await env.other.locks.tryAcquire(key, { limit: 2 }), null);
    const third = (await env.other.locks.tryAcquire(key, { limit: 3 }))!;
    assert.ok(third, 'a caller with limit 3 joins two holders');
    assert.equal(await env.other.locks.tryAcquire(key, { limit: 3 }), null);
    assert.equal(
      await env.other.locks.tryAcquire(key),
      null,
      'the plain lock waits for all of them',
    );
    await Promise.all([...two, third].map((lock) => lock.release()));

    const plain = await env.locks.acquire(key);
    assert.equal(await env.other.locks.tryAcquire(key, { limit: 5 }), null);
    const error = await env.other.locks
      .acquire(key, { limit: 5, acquireTimeout: 150 })
      .catch((e: unknown) => e);
    assert.ok(error instanceof LockAcquireTimeoutError, String(error));
    assert.equal(await plain.release(), true);
    const place = (await env.other.locks.tryAcquire(key, { limit: 5 }))!;
    assert.ok(place);
    assert.equal(await env.locks.tryAcquire(key), null);
    await place.release();
  });

  it('re-enters in the same call chain with the same limit; another limit there is a LockArgumentError', async () => {
    const key = uniqueKey('pool');
    await env.locks.using(
      key,
      async (outer) => {
        const fence = await env.locks.using(key, (inner) => inner.fence, {
          limit: 2,
          acquireTimeout: 0,
        });
        assert.equal(fence, outer.fence);
        await assert.rejects(
          env.locks.using(key, () => 1),
          LockArgumentError,
        );
        await assert.rejects(env.locks.acquire(key, { limit: 3 }), LockArgumentError);
      },
      { limit: 2 },
    );
    assert.equal(await env.locks.isLocked(key), false);
  });

  it('bad limits are a LockArgumentError naming `limit`', async () => {
    for (const limit of [0, -1, 1.5, Number.NaN, Infinity, '2', null, 2_000_000]) {
      const error = await env.locks
        .acquire(uniqueKey(), { limit: limit as number })
        .catch((e: unknown) => e);
      assert.ok(
        error instanceof LockArgumentError && error.argument === 'limit',
        `${String(limit)}: ${String(error)}`,
      );
    }
  });

  it('@WithLock({ limit }) runs at most `limit` calls at once, and a bad limit fails at definition', async () => {
    @Module({
      imports: [RedisLockModule.forRoot({ connection: env.server.url })],
      providers: [ExportJobs],
    })
    class JobsModule {}
    const module = await Test.createTestingModule({ imports: [JobsModule] }).compile();
    await module.init();
    try {
      const jobs = module.get(ExportJobs);
      const peaks = await Promise.all(Array.from({ length: 8 }, () => jobs.run()));
      assert.equal(Math.max(...peaks), 2);
      assert.equal(await module.get(LockService).isLocked('exports'), false);
    } finally {
      await module.close();
    }
    assert.throws(
      () =>
        WithLock({ key: 'k', limit: 0 })(class Jobs {}.prototype, 'run', {
          value: async () => 1,
        }),
      RedisLockConfigurationError,
    );
  });
});
