/**
 * `LockService.forceRelease(key, { reason })`: an operator frees a lock whatever holds it, on one
 * Redis, for every shape (another process's holder: processes.spec; Redlock and the Cluster:
 * redlock.spec and cluster.spec).
 */
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import {
  LockArgumentError,
  LockLostError,
  type ForcedRelease,
  type Lock,
  type LockEvent,
  type LockService,
} from '../../lib/index.js';
import {
  eventually,
  LogCapture,
  startLockModule,
  startNonPollingApp,
  twoAppsOnOneRedis,
  uniqueKey,
} from '../support/lock-module.js';
import { assertWithin, watchStalls } from '../support/timing.js';
import { FaultProxy } from '../support/fault-proxy.js';
import { monitorRedis, scriptCalls } from '../support/redis-monitor.js';
import { IS_HELD_SCRIPT } from '../../lib/redis/shape.scripts.js';

/** `locks.acquire(key, options)` left waiting (each is awaited by its test). */
function waitFor(locks: LockService, key: string, options: object = {}): Promise<Lock> {
  const pending = locks.acquire(key, { acquireTimeout: 20_000, ...options });
  pending.catch(() => {});
  return pending;
}

/** What a force freed, its fence left out (asserted on its own). */
const shape = ({ mode, holders }: ForcedRelease): Omit<ForcedRelease, 'fence'> => ({
  mode,
  holders,
});

/** Resolves how long after now `lock`'s signal aborts, and with what reason. */
function lossOf(lock: Lock): Promise<{ ms: number; reason: string }> {
  const from = performance.now();
  return new Promise((resolve) => {
    lock.signal.addEventListener('abort', () => {
      const error = lock.signal.reason as LockLostError;
      assert.ok(error instanceof LockLostError, String(error));
      resolve({ ms: performance.now() - from, reason: error.reason });
    });
  });
}

describe('forceRelease(key, { reason })', () => {
  const env = twoAppsOnOneRedis();

  it('frees a plain lock held in another instance: a warning names the reason, a forced event, the holder learns at its next extension', async () => {
    const key = uniqueKey();
    const ttl = 1_200;
    const lock = await env.other.locks.acquire(key, { ttl, autoExtend: true });
    const lost = lossOf(lock);
    const events: LockEvent[] = [];
    const subscription = env.locks.events.subscribe((event) => events.push(event));
    const { capture, restore } = LogCapture.install();
    const watch = watchStalls();
    try {
      const freed = await env.locks.forceRelease(key, { reason: 'ops: OPS-7 worker hung' });
      assert.deepEqual(shape(freed), { mode: 'exclusive', holders: 1 });
      assert.ok(freed.fence > lock.fence, `the force's fence ${freed.fence} above ${lock.fence}`);
      assert.deepEqual(events, [
        {
          type: 'forced',
          key,
          reason: 'ops: OPS-7 worker hung',
          mode: 'exclusive',
          holders: 1,
          fence: freed.fence,
        },
      ]);
      const warning = capture.lines.find((line) => line.level === 'warn');
      assert.match(
        warning?.message ?? '',
        new RegExp(
          `force-released \\(1 exclusive holder freed, fence ${freed.fence}\\): ops: OPS-7`,
        ),
      );
      assert.equal(await env.redis.exists(`lock:{${key}}`), 0, 'deleted in Redis');
      const took = await lost;
      assert.equal(took.reason, 'not-held');
      assertWithin(took.ms, ttl / 3, watch, 'the holder in another instance told');
    } finally {
      watch.stop();
      restore();
      subscription.unsubscribe();
    }
    assert.equal(await lock.release(), false, 'its release finds it gone');
  });

  it('a holder in the calling instance is told at once; one taken after the force is not touched', async () => {
    const key = uniqueKey();
    const lock = await env.locks.acquire(key, { ttl: 30_000 });
    const lost = lossOf(lock);
    const watch = watchStalls();
    const { fence } = await env.locks.forceRelease(key, { reason: 'test' });
    const took = await lost;
    // One check of Redis (`verify`), bounded by commandTimeout (default 1 s).
    assertWithin(took.ms, 1_000, watch, 'the holder in the calling instance told');
    watch.stop();
    const next = await env.locks.acquire(key, { ttl: 30_000 });
    assert.ok(next.fence > fence && fence > lock.fence, `${lock.fence} < ${fence} < ${next.fence}`);
    await env.locks.forceRelease(uniqueKey(), { reason: 'another key' });
    assert.equal(next.signal.aborted, false);
    await next.release();
  });

  it("a grant of the calling instance's that Redis answered just before the force is told too", async () => {
    const key = uniqueKey();
    // Sent one after the other on one connection: Redis grants, then the force frees.
    const acquiring = env.locks.acquire(key, { ttl: 30_000 });
    await env.locks.forceRelease(key, { reason: 'test' });
    const lock = await acquiring;
    assert.ok(lock.signal.aborted, 'the holder freed by the force is told by the time it returns');
  });

  it('a holder of the calling instance that releases while the force checks it is released, not lost: no lost event, its signal not aborted (found by mutation testing)', async () => {
    const proxy = await FaultProxy.start(() => env.server.port);
    const app = await startLockModule({ connection: `redis://127.0.0.1:${proxy.port}` });
    const monitor = await monitorRedis(env.server.port);
    const events: string[] = [];
    try {
      const key = uniqueKey();
      const lock = await app.locks.acquire(key, { ttl: 30_000 });
      void lock.signal; // watched
      const subscription = app.locks.events.subscribe((event) => {
        if (event.key === key) events.push(event.type);
      });
      // A slow link (300 ms each way): the release below goes out before the check's answer
      // comes back, whatever a loaded machine's stalls.
      proxy.setLatency(300);
      const forced = app.locks.forceRelease(key, { reason: 'test' });
      // The force is done and its check of the holder reached Redis: its answer is on its way.
      assert.ok(
        await eventually(
          () => scriptCalls(monitor.commands, IS_HELD_SCRIPT, `lock:{${key}}`) === 1,
        ),
        'the holder was never checked',
      );
      assert.equal(await lock.release(), false);
      await forced;
      subscription.unsubscribe();
      assert.deepEqual(events, ['forced', 'released']);
      assert.equal(lock.signal.aborted, false, 'release is not a loss');
    } finally {
      monitor.stop();
      await app.close();
      await proxy.close();
    }
  });

  it('an unwatched holder learns when its lease runs out', async () => {
    const key = uniqueKey();
    const lock = await env.other.locks.acquire(key, { ttl: 600, autoExtend: false });
    const lost = lossOf(lock);
    await env.locks.forceRelease(key, { reason: 'test' });
    assert.equal((await lost).reason, 'expired');
  });

  it('wakes the waiters of every process at once (they would not poll meanwhile)', async () => {
    const key = uniqueKey();
    const waiters = await startNonPollingApp({ connection: env.server.url });
    try {
      const lock = await env.locks.acquire(key, { ttl: 30_000 });
      const waiting = waitFor(waiters.locks, key);
      assert.ok(await eventually(async () => (await env.locks.inspect(key)).waiting === 1));
      const watch = watchStalls();
      const forcedAt = performance.now();
      await env.other.locks.forceRelease(key, { reason: 'test' });
      const next = await waiting;
      // Well under its next poll (60 s) and its acquireTimeout: woken by the force. Not 100 ms: a
      // loaded run took 364 ms for such a wake-up on a Cluster (the slack measures this process only).
      assertWithin(performance.now() - forcedAt, 1_000, watch, 'the waiter woken by the force');
      watch.stop();
      assert.ok(next.fence > lock.fence);
      await next.release();
    } finally {
      await waiters.close();
    }
  });

  it('a fair lock: the head of its queue gets it at once', async () => {
    const key = uniqueKey();
    const waiters = await startNonPollingApp({ connection: env.server.url });
    try {
      const lock = await env.locks.acquire(key, { ttl: 30_000, fair: true });
      const first = waitFor(waiters.locks, key, { fair: true });
      assert.ok(await eventually(async () => (await env.locks.inspect(key)).waiting === 1));
      const second = waitFor(waiters.locks, key, { fair: true });
      assert.ok(await eventually(async () => (await env.locks.inspect(key)).waiting === 2));
      const watch = watchStalls();
      const forcedAt = performance.now();
      await env.other.locks.forceRelease(key, { reason: 'test' });
      const head = await first;
      // Well under its next poll (60 s) and its acquireTimeout: woken by the force. Not 100 ms: a
      // loaded run took 364 ms for such a wake-up on a Cluster (the slack measures this process only).
      assertWithin(performance.now() - forcedAt, 1_000, watch, 'the head woken by the force');
      watch.stop();
      assert.ok(head.fence > lock.fence);
      await head.release();
      await (await second).release();
    } finally {
      await waiters.close();
    }
  });

  it('a semaphore: every place is freed, a waiter for a place gets one', async () => {
    const key = uniqueKey();
    const places = [
      await env.locks.acquire(key, { limit: 2, ttl: 30_000 }),
      await env.other.locks.acquire(key, {
        limit: 2,
        ttl: 900,
        autoExtend: true,
        token: `own-${key}`,
      }),
    ];
    const waiting = waitFor(env.other.locks, key, { limit: 2 });
    assert.deepEqual(shape(await env.locks.forceRelease(key, { reason: 'test' })), {
      mode: 'semaphore',
      holders: 2,
    });
    const place = await waiting;
    assert.equal(places[0].signal.aborted, true, 'the holder in the calling instance told at once');
    assert.ok(
      await eventually(() => places[1].signal.aborted, 2_000),
      'the other one at its check',
    );
    assert.equal(await env.redis.exists(`lock:{${key}}:fences`), 0, 'own tokens’ fences gone');
    await place.release();
  });

  it('read locks: every reader freed, the writer waiting for them gets the lock', async () => {
    const key = uniqueKey();
    const readers = [
      await env.locks.acquire(key, { mode: 'read', ttl: 30_000 }),
      await env.locks.acquire(key, { mode: 'read', ttl: 30_000 }),
    ];
    const writer = waitFor(env.other.locks, key);
    assert.ok(await eventually(async () => (await env.locks.inspect(key)).waiting === 1));
    assert.deepEqual(shape(await env.locks.forceRelease(key, { reason: 'test' })), {
      mode: 'read',
      holders: 2,
    });
    const lock = await writer;
    assert.ok(readers.every((reader) => reader.signal.aborted));
    await lock.release();
  });

  it("read locks with a writer's mark but no writer left to take them: the key lives as long as the mark, not as the readers", async () => {
    const key = uniqueKey();
    await env.locks.acquire(key, { mode: 'read', ttl: 30_000 });
    // A writer that marks the readers and leaves without taking back its mark (a process gone).
    await env.redis.hset(`lock:{${key}}`, '', String(Date.now() + 2_000));
    await env.locks.forceRelease(key, { reason: 'test' });
    const ttl = await env.redis.pttl(`lock:{${key}}`);
    assert.ok(
      ttl > 0 && ttl <= 2_100,
      `the key lives ${ttl} ms, as the mark (not the readers' 30 s)`,
    );
  });

  it('an own token’s recorded fence goes with it: the token takes the key afresh, above', async () => {
    const key = uniqueKey();
    const token = `job-${key}`;
    const lock = await env.locks.acquire(key, { token, ttl: 30_000 });
    assert.equal(await env.redis.exists(`lock:{${key}}:fence`), 1, 'the record of its fence');
    const { fence } = await env.other.locks.forceRelease(key, { reason: 'test' });
    assert.equal(await env.redis.exists(`lock:{${key}}:fence`), 0, 'the record goes with it');
    const again = await env.other.locks.acquire(key, { token, ttl: 30_000 });
    assert.ok(
      again.fence > fence && fence > lock.fence,
      `${lock.fence} < ${fence} < ${again.fence}`,
    );
    await again.release();
  });

  it('a free key: nothing freed, nothing announced', async () => {
    assert.deepEqual(shape(await env.locks.forceRelease(uniqueKey(), { reason: 'test' })), {
      mode: null,
      holders: 0,
    });
  });

  it('rejects a missing or empty reason, unknown options and a bad key', async () => {
    const locks = env.locks as unknown as {
      forceRelease(key: unknown, options?: unknown): Promise<unknown>;
    };
    for (const [key, options] of [
      ['k', undefined],
      ['k', {}],
      ['k', { reason: '  ' }],
      ['k', { reason: 7 }],
      ['k', { reason: 'x', force: true }],
      ['', { reason: 'x' }],
    ]) {
      await assert.rejects(locks.forceRelease(key, options), LockArgumentError);
    }
  });
});
