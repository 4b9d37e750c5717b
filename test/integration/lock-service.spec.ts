import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import { Logger } from '@nestjs/common';
import { Redis } from 'ioredis';
import {
  LockAcquireTimeoutError,
  LockArgumentError,
  LockLostError,
  type AcquireOptions,
  type Lock,
  type LockService,
} from '../../lib/index.js';
import {
  eventually,
  sleep,
  waitingCallers,
  startLockModule,
  uniqueKey,
  type LockModuleFixture,
} from '../support/lock-module.js';
import {
  ACQUIRE_OWN_TOKEN_SCRIPT,
  ACQUIRE_SCRIPT,
  FENCE_STRIDE,
  HANDOFF_SCRIPT,
  PASS_ON_SCRIPT,
} from '../../lib/redis/lock.scripts.js';
import { startRedis, type RedisServer } from '../support/redis-server.js';
import { monitorRedis, scriptCalls } from '../support/redis-monitor.js';

/** The fence counter every key of a Redis shares, under the default prefix. */
const COUNTER = 'lock:{}:counter';
import { RedisLockBackend } from '../../lib/redis/redis-lock.backend.js';
import { assertWithin, watchStalls } from '../support/timing.js';

describe('LockService on a single Redis', () => {
  let server: RedisServer;
  let fixture: LockModuleFixture;
  let locks: LockService;
  let redis: Redis;

  before(async () => {
    server = await startRedis();
    fixture = await startLockModule({ connection: server.url });
    locks = fixture.locks;
    redis = new Redis(server.port, '127.0.0.1');
  });
  after(async () => {
    await fixture?.close();
    redis?.disconnect();
    await server?.stop();
  });

  describe('acquire and release', () => {
    it('stores a 128-bit random token under the prefixed key with the TTL, atomically', async () => {
      const key = uniqueKey('order');
      await (await locks.acquire(uniqueKey())).release(); // the script loaded
      const monitor = await monitorRedis(server.port);
      let lock: Lock;
      try {
        lock = await locks.acquire(key, { ttl: 5_000 });
        await monitor.caughtUp();
      } finally {
        monitor.stop();
      }
      // One command sent, a script; in it, one write of the key that sets token and TTL
      // together (no SETNX then EXPIRE, no moment without a TTL).
      const onKey = monitor.commands.filter(({ args }) => args.includes(`lock:{${key}}`));
      assert.deepEqual(
        onKey.filter(({ source }) => source !== 'lua').map(({ args }) => args[0]),
        ['evalsha'],
      );
      const writes = onKey
        .filter(({ source }) => source === 'lua')
        .map(({ args }) => args.map((arg) => arg.toLowerCase()))
        .filter(([name]) => !['get', 'exists', 'pttl', 'type', 'hget', 'zscore'].includes(name));
      assert.deepEqual(writes, [['set', `lock:{${key}}`, lock.token, 'nx', 'px', '5000']]);
      assert.equal(lock.key, key);
      assert.match(lock.token, /^[0-9a-f]{32}$/);
      assert.equal(await redis.get(`lock:{${key}}`), lock.token);
      const pttl = await redis.pttl(`lock:{${key}}`);
      assert.ok(pttl > 4_000 && pttl <= 5_000, `pttl ${pttl}`);
      assert.ok(lock.expiresAt <= performance.now() + 5_000);
      assert.equal(await locks.isLocked(key), true);
      assert.equal(await lock.release(), true);
      assert.equal(await redis.exists(`lock:{${key}}`), 0);
      assert.equal(await locks.isLocked(key), false);
    });

    it('loads its scripts again when the server lost them (SCRIPT FLUSH): every operation still works', async () => {
      const key = uniqueKey();
      const first = await locks.acquire(key, { ttl: 5_000 });
      await redis.script('FLUSH');
      await first.extend(6_000);
      assert.equal(await first.release(), true);
      await redis.script('FLUSH');
      const second = await locks.acquire(key, { ttl: 5_000 });
      assert.ok(second.fence > first.fence);
      await redis.script('FLUSH');
      assert.equal(await second.release(), true);
      assert.equal(await redis.exists(`lock:{${key}}`), 0);
    });

    it('works on a client with an ioredis keyPrefix of its own: keys under both prefixes, waiters woken, scripts reloaded', async () => {
      const client = new Redis(server.port, '127.0.0.1', { keyPrefix: 'app:' });
      // No poll within the test's acquireTimeout: only the release can wake the waiter.
      const app = await startLockModule({ client, defaults: { retryInterval: 30_000 } });
      try {
        const key = uniqueKey();
        const lock = await app.locks.acquire(key, { ttl: 5_000 });
        assert.equal(await redis.get(`app:lock:{${key}}`), lock.token);
        // The counter (one for every key) stands at the end of the block the grant reserved.
        const counter = Number(await redis.get('app:lock:{}:counter'));
        assert.equal(counter, lock.fence + FENCE_STRIDE - 1);
        const waiter = app.locks.acquire(key, { acquireTimeout: 5_000 });
        await sleep(50);
        await redis.script('FLUSH');
        assert.equal(await lock.release(), true);
        const next = await waiter; // woken by the release: the next poll is 30 s away
        assert.ok(next.fence > lock.fence);
        await redis.script('FLUSH');
        assert.equal(await next.release(), true);
        assert.equal(await redis.exists(`app:lock:{${key}}`), 0);
      } finally {
        await app.close();
        client.disconnect();
      }
    });

    it('gives every acquisition a fresh token', async () => {
      const key = uniqueKey();
      const tokens = new Set<string>();
      for (let i = 0; i < 20; i++) {
        const lock = await locks.acquire(key);
        tokens.add(lock.token);
        await lock.release();
      }
      assert.equal(tokens.size, 20);
    });

    it('tryAcquire returns null at once while the lock is held, and never waits', async () => {
      const key = uniqueKey();
      const first = await locks.acquire(key);
      const started = performance.now();
      assert.equal(await locks.tryAcquire(key, { acquireTimeout: 5_000 }), null);
      // One attempt: nowhere near the 5 s it was offered to wait.
      assert.ok(performance.now() - started < 2_500);
      await first.release();
      const second = await locks.tryAcquire(key);
      assert.ok(second);
      await second.release();
    });

    it('acquire times out with LockAcquireTimeoutError carrying key and waited time', async () => {
      const key = uniqueKey();
      const held = await locks.acquire(key, { ttl: 10_000 });
      const watch = watchStalls();
      const started = performance.now();
      const error = await locks.acquire(key, { acquireTimeout: 300 }).catch((e: unknown) => e);
      const elapsed = performance.now() - started;
      assert.ok(error instanceof LockAcquireTimeoutError);
      assert.equal(error.key, key);
      assert.equal(error.acquireTimeout, 300);
      assert.ok(error.waitedMs >= 300, `waited ${error.waitedMs}`);
      assertWithin(error.waitedMs, 300, watch, 'the wait it reports');
      assert.ok(error.retryAfterMs !== undefined && error.retryAfterMs > 8_000);
      assert.ok(elapsed >= 300);
      assertWithin(elapsed, 300, watch, 'acquire() with acquireTimeout 300');
      watch.stop();
      await held.release();
    });

    it('acquireTimeout 0 makes exactly one attempt', async () => {
      const key = uniqueKey();
      const held = await locks.acquire(key);
      await assert.rejects(locks.acquire(key, { acquireTimeout: 0 }), LockAcquireTimeoutError);
      await held.release();
    });

    it('release through the service and the handle agree; a second release is false', async () => {
      const key = uniqueKey();
      const lock = await locks.acquire(key);
      assert.equal(await locks.release(lock), true);
      assert.equal(await lock.release(), false);
      assert.equal(await locks.release(lock), false);
    });

    it('lock commands sent in one tick share socket writes, and the socket is never left corked', async () => {
      const client = new Redis(server.port, '127.0.0.1');
      const app = await startLockModule({ client });
      try {
        await (await app.locks.acquire(uniqueKey())).release(); // scripts loaded on this connection
        const socket = client.stream as unknown as {
          _write: (...args: unknown[]) => void;
          _writev: (...args: unknown[]) => void;
          writableCorked: number;
        };
        let writes = 0;
        for (const method of ['_write', '_writev'] as const) {
          const original = socket[method];
          socket[method] = function (this: unknown, ...args: unknown[]) {
            writes++;
            return original.apply(this, args);
          };
        }
        const keys = Array.from({ length: 40 }, (_, i) => uniqueKey(`batch${i}`));
        const held = await Promise.all(keys.map((key) => app.locks.acquire(key)));
        assert.ok(writes <= 5, `${writes} socket writes for 40 acquisitions in one tick`);
        assert.equal(socket.writableCorked, 0);
        for (const [i, key] of keys.entries()) {
          assert.equal(await redis.get(`lock:{${key}}`), held[i].token);
        }
        writes = 0;
        assert.deepEqual(
          await Promise.all(held.map((lock) => lock.release())),
          keys.map(() => true),
        );
        assert.ok(writes <= 5, `${writes} socket writes for 40 releases in one tick`);
        assert.equal(socket.writableCorked, 0);
      } finally {
        await app.close();
        client.disconnect();
      }
    });

    it('rejects a lock object it did not create', async () => {
      const fake = {
        key: 'x',
        token: 't',
        fence: 1,
        expiresAt: 0,
        signal: new AbortController().signal,
      } as never;
      // Rejected, not thrown: every method that returns a Promise reports through it.
      await assert.rejects(locks.release(fake), LockArgumentError);
      await assert.rejects(locks.extend(fake), LockArgumentError);
    });
  });

  describe('expiry and ownership', () => {
    it('an expired lock is free again, and the old holder cannot release or extend the new one', async () => {
      const key = uniqueKey();
      const old = await locks.acquire(key, { ttl: 150 });
      await sleep(250);
      const current = await locks.acquire(key, { ttl: 5_000, acquireTimeout: 0 });
      assert.equal(await old.release(), false, 'stale holder must not release');
      assert.equal(await redis.get(`lock:{${key}}`), current.token, 'new holder keeps its key');
      await assert.rejects(old.extend(), LockLostError);
      assert.equal(await redis.get(`lock:{${key}}`), current.token);
      assert.ok(current.fence > old.fence);
      await current.release();
    });

    it('the expired holder learns it through its signal (reason "expired")', async () => {
      const key = uniqueKey();
      const lock = await locks.acquire(key, { ttl: 100 });
      await sleep(180);
      assert.equal(lock.signal.aborted, true);
      const reason = lock.signal.reason as LockLostError;
      assert.ok(reason instanceof LockLostError);
      assert.equal(reason.reason, 'expired');
      assert.equal(reason.key, key);
      await lock.release();
    });

    it('a signal read while the lock is held aborts on its own at the end of the lease', async () => {
      const watch = watchStalls();
      const lock = await locks.acquire(uniqueKey(), { ttl: 150 });
      const abortedAt = await new Promise<number>((resolve) =>
        lock.signal.addEventListener('abort', () => resolve(performance.now()), { once: true }),
      );
      assert.ok(abortedAt >= lock.expiresAt, `${lock.expiresAt - abortedAt} ms early`);
      assertWithin(abortedAt - lock.expiresAt, 0, watch, 'the abort after the lease');
      watch.stop();
      assert.equal((lock.signal.reason as LockLostError).reason, 'expired');
      await lock.release(); // true or false: Redis's own TTL ends a moment after the lease
    });

    it('a signal never aborts before the lease ends, even when its timer fires early', async () => {
      // Node counts timers in whole milliseconds of a clock that can lag `performance.now()`, so
      // one fires up to a few ms early (a CI run saw a lease's signal abort 0.4 ms before the
      // lease's end). Here every timer of 100 ms or more fires 30 ms early.
      const realSetTimeout = globalThis.setTimeout;
      globalThis.setTimeout = ((
        callback: (...args: unknown[]) => void,
        ms = 0,
        ...args: unknown[]
      ) => realSetTimeout(() => callback(...args), ms >= 100 ? ms - 30 : ms)) as typeof setTimeout;
      try {
        const watch = watchStalls();
        const lock = await locks.acquire(uniqueKey(), { ttl: 300 });
        const abortedAt = await new Promise<number>((resolve) =>
          lock.signal.addEventListener('abort', () => resolve(performance.now()), { once: true }),
        );
        assert.ok(abortedAt >= lock.expiresAt, `${lock.expiresAt - abortedAt} ms early`);
        assertWithin(abortedAt - lock.expiresAt, 0, watch, 'the abort after the lease');
        watch.stop();
        await lock.release();
      } finally {
        globalThis.setTimeout = realSetTimeout;
      }
    });

    it('a lease that ran out while nobody watched its signal is reported by extend() and re-entry', async () => {
      const lock = await locks.acquire(uniqueKey(), { ttl: 100 });
      await sleep(150);
      const error = await lock.extend().catch((e: unknown) => e);
      assert.ok(error instanceof LockLostError);
      assert.equal(error.reason, 'expired');
      assert.equal(lock.signal.reason, error, 'the signal, read now, tells the same');
      await lock.release();
    });

    it('a release after the lease ran out unnoticed (event loop blocked past the expiry) aborts the signal first', async () => {
      const lock = await locks.acquire(uniqueKey(), { ttl: 100 });
      const until = performance.now() + 150;
      while (performance.now() < until) {
        // Blocked: the expiry timer cannot fire, as in a long GC pause or a frozen process.
      }
      const releasing = lock.release();
      assert.equal(lock.signal.aborted, true, 'aborted before the release went out');
      assert.equal((lock.signal.reason as LockLostError).reason, 'expired');
      await releasing;
      // A lease that has not run out is released without a word.
      const fresh = await locks.acquire(uniqueKey(), { ttl: 10_000 });
      assert.equal(await fresh.release(), true);
      assert.equal(fresh.signal.aborted, false);
    });

    it('extend resets the TTL, and rejects with LockLostError once the key is gone', async () => {
      const key = uniqueKey();
      const lock = await locks.acquire(key, { ttl: 1_000 });
      await lock.extend(8_000);
      assert.ok((await redis.pttl(`lock:{${key}}`)) > 7_000);
      await locks.extend(lock, 3_000);
      assert.ok((await redis.pttl(`lock:{${key}}`)) <= 3_000);
      await redis.del(`lock:{${key}}`);
      const error = await lock.extend().catch((e: unknown) => e);
      assert.ok(error instanceof LockLostError);
      assert.equal(error.reason, 'not-held');
      assert.equal(await redis.exists(`lock:{${key}}`), 0, 'extend never re-creates a lost lock');
      assert.equal(lock.signal.aborted, true);
    });

    it('extend validates its ttl', async () => {
      const lock = await locks.acquire(uniqueKey());
      await assert.rejects(lock.extend(-1), LockArgumentError);
      await assert.rejects(lock.extend(Number.NaN), LockArgumentError);
      await lock.release();
    });
  });

  describe('maxWaiters', () => {
    it('a caller beyond the waiters allowed per key, or in all, fails at once, saying so; the others wait and get the key', async () => {
      const app = await startLockModule({
        connection: server.url,
        maxWaiters: { perKey: 3, perProcess: 5 },
      });
      const [a, b] = [uniqueKey('a'), uniqueKey('b')];
      const heldA = await locks.acquire(a, { ttl: 10_000 });
      const heldB = await locks.acquire(b, { ttl: 10_000 });
      try {
        const wait = (key: string) => app.locks.using(key, () => 'ran', { acquireTimeout: 10_000 });
        const waitingA = [wait(a), wait(a), wait(a)];
        assert.ok(await eventually(() => waitingCallers(app.locks, a) === 3), 'they wait');
        const watch = watchStalls();
        const started = performance.now();
        const refusedA = await wait(a).catch((error: unknown) => error);
        const took = performance.now() - started;
        assert.ok(refusedA instanceof LockAcquireTimeoutError, String(refusedA));
        assert.deepEqual(refusedA.queueFull, { limit: 'perKey', waiters: 3 });
        assert.equal(refusedA.busy, true);
        assert.match(
          refusedA.message,
          /3 callers of this LockService already wait for this key \(maxWaiters\.perKey\)/,
        );
        // At once (no command sent), not after the 10 s acquireTimeout.
        assertWithin(took, 0, watch, 'the refusal');
        watch.stop();
        // A call that does not wait is never refused.
        assert.equal(await app.locks.tryAcquire(a), null);
        const waitingB = [wait(b), wait(b)];
        assert.ok(await eventually(() => waitingCallers(app.locks) === 5), 'they wait');
        const refusedB = await wait(b).catch((error: unknown) => error);
        assert.ok(refusedB instanceof LockAcquireTimeoutError, String(refusedB));
        assert.deepEqual(refusedB.queueFull, { limit: 'perProcess', waiters: 5 });
        await heldA.release();
        await heldB.release();
        assert.deepEqual(await Promise.all([...waitingA, ...waitingB]), Array(5).fill('ran'));
        // Everyone left: the counts are back to nothing.
        const again = await locks.acquire(a, { ttl: 10_000 });
        const waitingAgain = [wait(a), wait(a), wait(a)];
        assert.ok(await eventually(() => waitingCallers(app.locks, a) === 3), 'they wait again');
        await again.release();
        assert.deepEqual(await Promise.all(waitingAgain), ['ran', 'ran', 'ran']);
      } finally {
        await heldA.release();
        await heldB.release();
        await app.close();
      }
    });
  });

  describe('maxWaiters: what a refused caller leaves (found by review)', () => {
    it("refused writers never take back the mark that another process's waiting writer keeps on a read lock", async () => {
      const crowded = await startLockModule({
        connection: server.url,
        maxWaiters: { perKey: 1_000, perProcess: 1 },
      });
      const writers = await startLockModule({ connection: server.url });
      const key = uniqueKey();
      const other = uniqueKey();
      const reader = await locks.acquire(key, { mode: 'read', ttl: 10_000 });
      const blocker = await locks.acquire(other, { ttl: 10_000 });
      try {
        // The crowded service's one waiter slot is taken (by a wait for another key).
        const slot = crowded.locks.acquire(other, { acquireTimeout: 10_000 }).catch(() => null);
        assert.ok(await eventually(() => waitingCallers(crowded.locks) === 1), 'the slot is taken');
        // A writer of another process waits for the read lock: it marks the key.
        const writer = writers.locks.acquire(key, { acquireTimeout: 10_000 });
        assert.ok(await eventually(async () => (await redis.hexists(`lock:{${key}}`, '')) === 1));
        for (let i = 0; i < 20; i++) {
          const refusal = await crowded.locks
            .acquire(key, { acquireTimeout: 5_000 })
            .catch((e) => e);
          assert.ok(
            refusal instanceof LockAcquireTimeoutError && refusal.queueFull,
            String(refusal),
          );
        }
        assert.equal(
          await redis.hexists(`lock:{${key}}`, ''),
          1,
          "the waiting writer's mark is still there",
        );
        // New readers now wait for the writer, which gets the key once the reader leaves.
        assert.equal(await locks.tryAcquire(key, { mode: 'read' }), null);
        await reader.release();
        const held = await writer;
        await held.release();
        await blocker.release();
        await (await slot)?.release();
      } finally {
        await reader.release();
        await blocker.release();
        await crowded.close();
        await writers.close();
      }
    });

    it('a burst of refused callers sends one attempt each and nothing more', async () => {
      const app = await startLockModule({ connection: server.url, maxWaiters: { perKey: 3 } });
      const key = uniqueKey();
      const held = await locks.acquire(key, { ttl: 10_000 });
      const evalshaCalls = async (): Promise<number> =>
        Number(/cmdstat_evalsha:calls=(\d+)/.exec(await redis.info('commandstats'))?.[1] ?? 0);
      try {
        const before = await evalshaCalls();
        const calls = Array.from({ length: 100 }, () =>
          app.locks.acquire(key, { acquireTimeout: 5_000 }).catch((e: unknown) => e),
        );
        assert.ok(await eventually(() => waitingCallers(app.locks, key) === 3), 'three wait');
        const during = (await evalshaCalls()) - before;
        // 100 first attempts, and the 3 waiters' subscriptions' one retry each at most.
        assert.ok(during <= 100 + 3 + 1, `${during} scripts for 100 callers`);
        await held.release();
        const outcomes = await Promise.all(calls);
        const refused = outcomes.filter(
          (outcome) => outcome instanceof LockAcquireTimeoutError && outcome.queueFull,
        );
        assert.equal(refused.length, 97);
        for (const outcome of outcomes) {
          if (!(outcome instanceof Error)) await (outcome as Lock).release();
        }
      } finally {
        await held.release();
        await app.close();
      }
    });
  });

  describe('caller tokens', () => {
    it('re-acquiring with the token that holds the key succeeds, keeps the fence and resets the TTL', async () => {
      const key = uniqueKey();
      const token = 'request-7f3a9c';
      const first = await locks.acquire(key, { token, ttl: 2_000 });
      assert.equal(first.token, token);
      const again = await locks.acquire(key, { token, ttl: 9_000, acquireTimeout: 0 });
      assert.equal(again.fence, first.fence);
      assert.ok((await redis.pttl(`lock:{${key}}`)) > 8_000);
      assert.equal(await locks.tryAcquire(key, { token: 'someone-else' }), null);
      await again.release();
      assert.equal(await redis.exists(`lock:{${key}}`), 0);
    });

    it('re-acquiring with a shorter TTL never shortens the lock: a handle taken earlier keeps its lease (found by the model suite), for every shape', async () => {
      for (const shape of [{}, { limit: 2 }, { mode: 'read' as const }, { fair: true }]) {
        const key = uniqueKey();
        const token = uniqueKey('own');
        const long = await locks.acquire(key, { ...shape, token, ttl: 30_000 });
        const short = await locks.acquire(key, { ...shape, token, ttl: 300, acquireTimeout: 0 });
        assert.equal(short.fence, long.fence);
        await sleep(400);
        // Another caller is still kept out for the first handle's lease, which it believes in.
        assert.equal(await locks.tryAcquire(key, { ttl: 1_000 }), null, JSON.stringify(shape));
        assert.ok(long.expiresAt > performance.now());
        await long.release();
      }
    });
  });

  describe('fencing tokens', () => {
    it('increase strictly across successive holders', async () => {
      const key = uniqueKey();
      let last = 0;
      for (let i = 0; i < 50; i++) {
        const lock = await locks.acquire(key);
        assert.ok(Number.isSafeInteger(lock.fence));
        assert.ok(lock.fence > last, `fence ${lock.fence} after ${last}`);
        last = lock.fence;
        await lock.release();
      }
    });

    it('every grant, of any key and shape, is above every fence the counter gave before, the blocks reserved for pass-ons included', async () => {
      const shapes: [string, (key: string) => Promise<Lock>][] = [
        ['plain (a block)', (key) => locks.acquire(key)],
        ['own token', (key) => locks.acquire(key, { token: `own-${key}` })],
        ['semaphore', (key) => locks.acquire(key, { limit: 2 })],
        ['read', (key) => locks.acquire(key, { mode: 'read' })],
        ['fair', (key) => locks.acquire(key, { fair: true })],
        ['several keys', (key) => locks.acquire([key, `${key}:b`])],
      ];
      let highest = 0;
      for (let round = 0; round < 3; round++) {
        for (const [shape, take] of shapes) {
          const lock = await take(uniqueKey(shape.replace(/\W/g, '')));
          for (const fence of Object.values(lock.fences)) {
            assert.ok(fence > highest, `${shape}: fence ${fence} after ${highest} went back`);
          }
          const top = Math.max(...Object.values(lock.fences));
          highest = shape.startsWith('plain') ? top + FENCE_STRIDE - 1 : top;
          assert.equal(Number(await redis.get(COUNTER)), highest, `${shape}: the counter`);
          await lock.release();
        }
      }
    });

    it('keep increasing after the counter key is deleted', async () => {
      const key = uniqueKey();
      const first = await locks.acquire(key);
      await first.release();
      // The end of the block of fences its grant reserved (see FENCE_STRIDE), in the counter that
      // every key of a Redis shares.
      assert.equal(await redis.get(COUNTER), String(first.fence + FENCE_STRIDE - 1));
      await redis.del(COUNTER);
      const second = await locks.acquire(key);
      assert.ok(second.fence > first.fence);
      await second.release();
    });

    it('stay above every earlier fence when the counter is behind them (a promoted replica that missed the last writes): the server clock is', async () => {
      const key = uniqueKey();
      const first = await locks.acquire(key);
      await first.release();
      // What a replica promoted before it received the last grants would have: an older count.
      await redis.set(COUNTER, String(first.fence - 1_000_000), 'KEEPTTL');
      const second = await locks.acquire(key);
      assert.ok(second.fence > first.fence, `${second.fence} after ${first.fence}`);
      await second.release();
      // However far behind the count: the fence is the server's clock in µs (or the counter + 1
      // where that is higher).
      const before = await redis.time();
      const clock = Number(before[0]) * 1_000_000 + Number(before[1]);
      await redis.set(COUNTER, '5', 'KEEPTTL');
      const third = await locks.acquire(key);
      assert.ok(third.fence >= clock && third.fence > second.fence, `${third.fence}`);
      await third.release();
    });

    it('stay above a counter that is ahead of the server clock, and keep it alive with the lock', async () => {
      const key = uniqueKey();
      const ahead = 9_000_000_000_000_000; // beyond TIME in µs for centuries
      await redis.set(COUNTER, String(ahead), 'PX', 500);
      try {
        const lock = await locks.acquire(key, { ttl: 1_000 });
        assert.equal(lock.fence, ahead + 1);
        assert.ok((await redis.pttl(COUNTER)) > 1_000, 'counter outlives the lock');
        await lock.release();
        // The raised fence was written back: the next holders stay above it, never back at the clock.
        for (const other of [key, uniqueKey()]) {
          const next = await locks.acquire(other, { ttl: 1_000 });
          assert.ok(next.fence > lock.fence, `a fence went back: ${lock.fence} → ${next.fence}`);
          await next.release();
        }
      } finally {
        await redis.del(COUNTER); // back to the clock for the other tests
      }
    });

    it('are exact safe integers up to 2^53 µs, where the server clock gets in the year 2255: grants, blocks and pass-ons', async () => {
      const key = uniqueKey();
      // Odd and 16 digits: a float or a %.14g string anywhere on the way would show.
      const near = Number.MAX_SAFE_INTEGER - 3 * FENCE_STRIDE - 4;
      await redis.set(COUNTER, String(near));
      const monitor = await monitorRedis(server.port);
      try {
        const lock = await locks.acquire(key, { ttl: 5_000 });
        assert.equal(lock.fence, near + 1);
        // The end of its block, written back exactly.
        assert.equal(await redis.get(COUNTER), String(near + FENCE_STRIDE));
        // An heir in the process, asleep (its attempt and its attempt once subscribed have run),
        // is passed the next fence of the block.
        const heir = locks.acquire(key, { ttl: 5_000, acquireTimeout: 5_000 });
        assert.ok(
          await eventually(
            () => scriptCalls(monitor.commands, ACQUIRE_SCRIPT, `lock:{${key}}`) >= 3,
          ),
          'the heir is asleep',
        );
        await lock.release();
        const next = await heir;
        assert.equal(next.fence, near + 2);
        await next.release();
        // The next grant takes the next block.
        const other = await locks.acquire(uniqueKey());
        assert.equal(other.fence, near + FENCE_STRIDE + 1);
        assert.equal(await redis.get(COUNTER), String(near + 2 * FENCE_STRIDE));
        assert.ok(Number.isSafeInteger(near + 2 * FENCE_STRIDE));
        await other.release();
      } finally {
        monitor.stop();
        await redis.del(COUNTER); // back to the clock for the other tests
      }
    });

    it('leave a counter written by hand without a TTL without one, and stay above it', async () => {
      const key = uniqueKey();
      const ahead = 8_000_000_000_000_000;
      await redis.set(COUNTER, String(ahead));
      try {
        const lock = await locks.acquire(key, { ttl: 1_000 });
        assert.equal(lock.fence, ahead + 1);
        // PEXPIRE … GT leaves a key without a TTL as it is: it outlives every lock, as a fence needs.
        assert.equal(await redis.pttl(COUNTER), -1);
        await lock.release();
      } finally {
        await redis.del(COUNTER); // back to the clock for the other tests
      }
    });

    it('a resent grant (a reply lost with its connection) takes a new block; a caller token keeps its fence; a resent pass-on is answered the same, a resent handoff with a new block', async () => {
      const key = uniqueKey();
      // A counter of this test's own (the scripts take any name for it).
      const [lockKey, fenceKey, ownKey] = [
        `lock:{${key}}`,
        `lock:{${key}}:counter`,
        `lock:{${key}}:fence`,
      ];
      const acquire = (script: string, token: string): Promise<unknown> =>
        script === ACQUIRE_OWN_TOKEN_SCRIPT
          ? redis.eval(script, 3, lockKey, fenceKey, ownKey, token, 5_000, 65_000)
          : redis.eval(script, 2, lockKey, fenceKey, token, 5_000, 65_000);
      // The generated token's script, run twice as ioredis would resend it.
      const first = Number(await acquire(ACQUIRE_SCRIPT, 'generated'));
      const resent = Number(await acquire(ACQUIRE_SCRIPT, 'generated'));
      assert.ok(resent >= first + FENCE_STRIDE, `${resent} after the block of ${first}`);
      assert.equal(Number(await redis.get(fenceKey)), resent + FENCE_STRIDE - 1);
      // Passed on (the heir took resent + 1), then the same write again: both say it holds.
      const passOn = (): Promise<unknown> =>
        redis.eval(PASS_ON_SCRIPT, 2, lockKey, fenceKey, 'generated', 'heir', 7_000, 67_000);
      assert.equal(await passOn(), 1);
      assert.equal(await passOn(), 1);
      assert.equal(await redis.get(lockKey), 'heir');
      // Nobody else's: refused, nothing changed.
      assert.equal(
        await redis.eval(PASS_ON_SCRIPT, 2, lockKey, fenceKey, 'other', 'x', 7_000, 67_000),
        0,
      );
      assert.equal(await redis.get(lockKey), 'heir');
      // Handed straight to a waiter through Redis, then the same handoff again (resent): the
      // second answers a new block for the heir, not 0 (the heir would never hold its lock).
      const handOff = async (): Promise<number> =>
        Number(
          await redis.eval(HANDOFF_SCRIPT, 2, lockKey, fenceKey, 'heir', 'next', 7_000, 67_000),
        );
      const handed = await handOff();
      const handedAgain = await handOff();
      assert.ok(handed > 0 && handedAgain >= handed + FENCE_STRIDE, `${handed}, ${handedAgain}`);
      assert.equal(await redis.get(lockKey), 'next');
      await redis.del(lockKey);
      // A caller's own token: one fence per grant, the same one again while it holds the lock.
      const own = Number(await acquire(ACQUIRE_OWN_TOKEN_SCRIPT, 'mine'));
      assert.ok(own > resent + FENCE_STRIDE - 1);
      assert.equal(Number(await acquire(ACQUIRE_OWN_TOKEN_SCRIPT, 'mine')), own);
      assert.equal(Number(await redis.get(fenceKey)), own);
      assert.equal(Number(await redis.get(ownKey)), own, 'its fence, kept for its token');
      assert.ok((await redis.pttl(ownKey)) <= 5_000, 'for as long as its lock');
      await redis.del(lockKey, fenceKey, ownKey);
    });

    it("a Redlock undo runs before the next attempt with its token, on a node that lost its scripts too (EVALSHA's re-sent release would delete the re-taken copy)", async () => {
      const client = new Redis(server.port, '127.0.0.1');
      const node = new RedisLockBackend(
        client,
        {
          keyPrefix: 'lock:',
          commandTimeout: 2_000,
          fenceRetention: 60_000,
          replicaAck: undefined,
        },
        false,
        new Logger('test'),
      );
      const key = uniqueKey();
      /** A failed attempt's copy, the node restarted empty, then its undo and the next attempt. */
      const retake = async (
        undo: () => Promise<boolean>,
      ): Promise<{ next: boolean; owner: string | null }> => {
        assert.equal((await node.tryAcquire(key, 'token', 5_000)).acquired, true);
        await redis.script('FLUSH');
        // Someone's attempt loads the acquire script again (NOSCRIPT, then EVAL); not the release.
        assert.equal((await node.tryAcquire(key, 'other', 5_000)).acquired, false);
        // On one connection: the undo, then at once the same token's next attempt.
        const [, next] = await Promise.all([undo(), node.tryAcquire(key, 'token', 5_000)]);
        const owner = await redis.get(`lock:{${key}}`);
        await redis.del(`lock:{${key}}`);
        return { next: next.acquired, owner };
      };
      try {
        // What an undo by EVALSHA did: its NOSCRIPT re-send ran after the attempt re-took the copy.
        assert.deepEqual(await retake(() => node.release(key, 'token')), {
          next: true,
          owner: null,
        });
        assert.deepEqual(await retake(() => node.undoCopy(key, 'token', '')), {
          next: true,
          owner: 'token',
        });
      } finally {
        await node.close();
        client.disconnect();
      }
    });

    it('keep their counter for the TTL plus fenceRetention (default one minute), then let it go; a longer lock keeps it longer, a shorter one never cuts it short', async () => {
      // The slack below is what the test measured between the grant and the read, not a guess.
      await redis.del(COUNTER);
      let sent = performance.now();
      const lock = await locks.acquire(uniqueKey(), { ttl: 2_000 });
      const pttl = await redis.pttl(COUNTER);
      let took = performance.now() - sent;
      assert.ok(pttl >= 62_000 - took - 1 && pttl <= 62_000, `counter PTTL ${pttl} (${took} ms)`);
      sent = performance.now();
      const longer = await locks.acquire(uniqueKey(), { ttl: 9_000 });
      const shorter = await locks.acquire(uniqueKey(), { ttl: 1_000 });
      const kept = await redis.pttl(COUNTER);
      took = performance.now() - sent;
      assert.ok(kept >= 69_000 - took - 1 && kept <= 69_000, `counter PTTL ${kept} (${took} ms)`);
      await Promise.all([lock, longer, shorter].map((each) => each.release()));
    });

    it('get their counter TTL (the lock TTL + fenceRetention) from every shape, extension and several keys, and a block of fences only for the plain lock', async () => {
      // One counter for every key: deleted before each shape, so each sets its TTL afresh.
      const counterTtl = async (_key: string): Promise<number> => redis.pttl(COUNTER);
      const near = (pttl: number, expected: number, what: string): void =>
        assert.ok(pttl > expected - 1_000 && pttl <= expected, `${what}: counter PTTL ${pttl}`);
      const shapes: [string, AcquireOptions][] = [
        ['plain lock', {}],
        ['semaphore', { limit: 2 }],
        ['read lock', { mode: 'read' }],
        ['fair lock', { fair: true }],
      ];
      for (const [what, options] of shapes) {
        const key = uniqueKey(what.replace(' ', '-'));
        await redis.del(COUNTER);
        const lock = await locks.acquire(key, { ttl: 3_000, ...options });
        near(await counterTtl(key), 63_000, what);
        // Only the plain lock reserves a block of fences (for heirs in its process).
        const block = what === 'plain lock' ? FENCE_STRIDE : 1;
        const counter = Number(await redis.get(COUNTER));
        assert.equal(counter, lock.fence + block - 1, `${what}: the counter after its grant`);
        await lock.extend(5_000);
        near(await counterTtl(key), 65_000, `${what}, extended`);
        await lock.release();
      }
      const [a, b] = [uniqueKey('all-a'), uniqueKey('all-b')];
      await redis.del(COUNTER);
      const both = await locks.acquire([a, b], { ttl: 4_000 });
      near(await counterTtl(a), 64_000, 'several keys');
      near(await counterTtl(b), 64_000, 'several keys');
      // Several keys in one step: one fence each, no block (in key order, from one counter).
      assert.ok(both.fences[b] > both.fences[a], JSON.stringify(both.fences));
      assert.equal(Number(await redis.get(COUNTER)), both.fences[b]);
      await both.release();
      // A handoff's counter TTL: in waiting.spec, where the handoff is seen to happen.
    });

    it('with fenceRetention 0 the counter lives as long as the longest lock, nothing of a key stays, and fences still increase after it', async () => {
      // A prefix of its own: a counter of its own.
      const app = await startLockModule({
        connection: server.url,
        fenceRetention: 0,
        keyPrefix: 'zero:',
      });
      try {
        const key = uniqueKey();
        const first = await app.locks.acquire(key, { ttl: 600 });
        const pttl = await redis.pttl('zero:{}:counter');
        assert.ok(pttl > 0 && pttl <= 600, `counter PTTL ${pttl}`);
        await sleep(700); // lock and counter expire together; nothing is left
        assert.equal(await redis.exists(`zero:{${key}}`, 'zero:{}:counter'), 0);
        const second = await app.locks.acquire(key);
        assert.ok(second.fence > first.fence, `${second.fence} after ${first.fence}`);
        assert.equal(await second.release(), true);
        // Released: nothing of the key stays behind; the counter, until the lock's TTL.
        assert.deepEqual(await redis.keys('zero:*'), ['zero:{}:counter']);
        assert.ok((await redis.pttl('zero:{}:counter')) <= 10_000);
        const third = await app.locks.acquire(key);
        assert.ok(third.fence > second.fence, `${third.fence} after ${second.fence}`);
        await third.release();
      } finally {
        await app.close();
      }
    });

    it('nothing of a key stays once its lock is released, whatever fenceRetention: every shape, your own token, several keys; only the counter', async () => {
      for (const fenceRetention of [0, 1_000, 60_000]) {
        const keyPrefix = `retain${fenceRetention}:`;
        const options = { connection: server.url, fenceRetention, keyPrefix };
        const [app, other] = [await startLockModule(options), await startLockModule(options)];
        try {
          const takes: AcquireOptions[] = [
            {},
            { token: 'own' },
            { limit: 2 },
            { limit: 2, token: 'own' },
            { mode: 'read' },
            { mode: 'read', token: 'own' },
            { mode: 'write' },
            { fair: true },
            { fair: true, token: 'own' },
          ];
          for (const options of takes) {
            const lock = await app.locks.acquire(uniqueKey(), options);
            assert.equal(await lock.release(), true);
          }
          const [a, b] = [uniqueKey(), uniqueKey()];
          for (const token of [undefined, 'own']) {
            assert.equal(await (await app.locks.acquire([a, b], { token })).release(), true);
          }
          // A waiter queued (its process in the queue of waiting processes), then served.
          const key = uniqueKey();
          const held = await app.locks.acquire(key);
          const waiting = other.locks.acquire(key, { acquireTimeout: 5_000 });
          assert.ok(await eventually(() => waitingCallers(other.locks, key) === 1));
          await held.release();
          await (await waiting).release();
          assert.deepEqual(
            await redis.keys(`${keyPrefix}*`),
            [`${keyPrefix}{}:counter`],
            `fenceRetention ${fenceRetention}`,
          );
        } finally {
          await Promise.all([app.close(), other.close()]);
        }
      }
    });

    it('are independent per key', async () => {
      const a = await locks.acquire(uniqueKey('a'));
      const b = await locks.acquire(uniqueKey('b'));
      assert.ok(a.fence > 0 && b.fence > 0);
      await a.release();
      await b.release();
    });
  });

  describe('mutual exclusion', () => {
    // A read-modify-write with a pause in the middle: only exclusion keeps the count right.
    async function racyIncrement(counter: string): Promise<void> {
      const value = Number(await redis.get(counter));
      await sleep(2);
      await redis.set(counter, value + 1);
    }

    it('control: without the lock, concurrent increments lose updates', async () => {
      const counter = uniqueKey('counter');
      await Promise.all(Array.from({ length: 20 }, () => racyIncrement(counter)));
      assert.ok(Number(await redis.get(counter)) < 20, 'the race must be observable');
    });

    it('with using(), holders never overlap and no update is lost', async () => {
      const key = uniqueKey();
      const counter = uniqueKey('counter');
      let inside = 0;
      let maxInside = 0;
      await Promise.all(
        Array.from({ length: 20 }, () =>
          locks.using(
            key,
            async () => {
              maxInside = Math.max(maxInside, ++inside);
              await racyIncrement(counter);
              inside--;
            },
            { acquireTimeout: 10_000 },
          ),
        ),
      );
      assert.equal(maxInside, 1);
      assert.equal(Number(await redis.get(counter)), 20);
    });
  });
});
