import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import {
  LockAcquireTimeoutError,
  LockArgumentError,
  LockLostError,
  RedisLockConfigurationError,
  WithLock,
  type Lock,
  type LockService,
} from '../../lib/index.js';
import {
  eventually,
  sleep,
  startLockModule,
  startNonPollingApp,
  twoAppsOnOneRedis,
  assertOwnTokenKeepsFence,
  uniqueKey,
  waitingCallers,
} from '../support/lock-module.js';
import { assertWithin, watchStalls } from '../support/timing.js';
import { FaultProxy } from '../support/fault-proxy.js';
import { monitorRedis, scriptCalls } from '../support/redis-monitor.js';
import { ACQUIRE_UNRESERVED_SCRIPT } from '../../lib/redis/lock.scripts.js';
import { ACQUIRE_READ_SCRIPT } from '../../lib/redis/shape.scripts.js';

describe("read/write locks (mode: 'read')", () => {
  const env = twoAppsOnOneRedis({ fenceRetention: 0 });

  const read = { mode: 'read' } as const;
  /** The process left the key's queue of waiting processes (`turns`); then the rest released. */
  const assertLeftTheQueue = async (turns: string, held: Lock, reader: Promise<Lock>) => {
    assert.ok(
      await eventually(async () => (await env.redis.exists(turns)) === 0, 2_000),
      'the process stayed queued with only a reader of it waiting',
    );
    await held.release();
    await (await reader).release();
  };

  it('readers share the key, each with its own token, lease and greater fence; they exclude writers and writers exclude them', async () => {
    const key = uniqueKey('doc');
    const first = await env.locks.acquire(key, read);
    const second = await env.other.locks.acquire(key, { ...read, ttl: 5_000 });
    assert.notEqual(first.token, second.token);
    assert.ok(second.fence > first.fence);
    assert.equal(await env.locks.isLocked(key), true);
    assert.equal(await env.other.locks.tryAcquire(key), null, 'a writer waits for the readers');
    assert.equal(await env.other.locks.tryAcquire(key, { mode: 'write' }), null);

    await first.release();
    const waiter = await startNonPollingApp({ connection: env.server.url, fenceRetention: 0 });
    try {
      // Within 3 s: short of its next poll (60 s) and of the second reader's TTL (5 s).
      const waiting = waiter.locks.acquire(key, { acquireTimeout: 3_000 });
      assert.ok(await eventually(() => waitingCallers(waiter.locks, key) === 1), 'it waits');
      assert.equal(await second.release(), true);
      const writer = await waiting; // so the last reader's release woke it
      assert.ok(writer.fence > second.fence);
      assert.equal(await env.locks.tryAcquire(key, read), null, 'a reader waits for the writer');
      assert.equal(await writer.release(), true);
    } finally {
      await waiter.close();
    }
    assert.equal(await env.redis.exists(`lock:{${key}}`), 0, 'nothing left');
  });

  it('an extension with a shorter TTL: the key lives no longer than its readers', async () => {
    const key = uniqueKey('doc');
    const reader = await env.locks.acquire(key, { ...read, ttl: 30_000 });
    await reader.extend(200);
    const ttl = await env.redis.pttl(`lock:{${key}}`);
    assert.ok(ttl > 0 && ttl <= 200, `the key lives ${ttl} ms after a 200 ms extension`);
    await sleep(300);
    assert.equal(await env.locks.isLocked(key), false, 'no key left once its reader ran out');
  });

  it('a release of the longest reader: the key lives no longer than the readers left', async () => {
    const key = uniqueKey('doc');
    const longest = await env.locks.acquire(key, { ...read, ttl: 30_000 });
    const left = await env.locks.acquire(key, { ...read, ttl: 300 });
    assert.equal(await longest.release(), true);
    const ttl = await env.redis.pttl(`lock:{${key}}`);
    assert.ok(ttl > 0 && ttl <= 300, `the key lives ${ttl} ms, as its reader left`);
    await left.release();
  });

  it('never lets a writer overlap anyone, while readers do overlap each other (control: without the lock both rules break)', async () => {
    const key = uniqueKey('doc');
    let readers = 0;
    let writers = 0;
    let violations = 0;
    let shared = 0;
    const reading = async (): Promise<void> => {
      if (++readers > 1) shared++;
      if (writers > 0) violations++;
      await sleep(3);
      readers--;
    };
    const writing = async (): Promise<void> => {
      if (++writers > 1 || readers > 0) violations++;
      await sleep(3);
      writers--;
    };
    const run = (locked: boolean): Promise<unknown> =>
      Promise.all(
        Array.from({ length: 40 }, (_, i) => {
          const [work, mode] =
            i % 4 === 0 ? [writing, 'write' as const] : [reading, 'read' as const];
          const service = i % 2 ? env.locks : env.other.locks;
          return locked ? service.using(key, work, { mode, acquireTimeout: 10_000 }) : work();
        }),
      );
    await run(true);
    assert.equal(violations, 0);
    assert.ok(shared > 0, 'readers shared the key');
    await run(false);
    assert.ok(violations > 0, 'the control shows the race');
  });

  it('readers queued in one process behind a writer all get in at its release, not one per retry interval', async () => {
    const key = uniqueKey('doc');
    const writer = await env.other.locks.acquire(key, { ttl: 30_000 });
    // Readers that never poll within their 10 s: each gets in only if the release lets it in.
    const app = await startNonPollingApp({ connection: env.server.url, fenceRetention: 0 });
    try {
      const monitor = await monitorRedis(env.server.port);
      const readers = [0, 1, 2].map(() =>
        app.locks.acquire(key, { ...read, acquireTimeout: 10_000 }),
      );
      // Each tried twice (at once, and once subscribed) and found the key written, and sleeps:
      // any lock they get now, a release let in. The release wakes the first; each reader let in
      // wakes the next (a writer's release wakes one waiter per process).
      const tries = (): number =>
        scriptCalls(monitor.commands, ACQUIRE_READ_SCRIPT, `lock:{${key}}`);
      assert.ok(await eventually(() => tries() >= 6), `${tries()} of 6 attempts`);
      monitor.stop();
      const stalls = watchStalls();
      await writer.release();
      const released = performance.now();
      const held = await Promise.all(readers);
      // At the release, not at their deadline's last attempt (readers let in then share the key
      // too): a few round trips.
      assertWithin(performance.now() - released, 0, stalls, 'the readers getting in');
      stalls.stop();
      await Promise.all(held.map((lock) => lock.release()));
    } finally {
      await app.close();
    }
  });

  it('writer preference: while a writer waits, no new reader joins, so a stream of readers cannot starve it', async () => {
    const key = uniqueKey('doc');
    let stop = false;
    // Four readers in turn, overlapping: without the preference the key would never be free.
    const readerLoop = async (offset: number): Promise<void> => {
      await sleep(offset);
      while (!stop) {
        await env.other.locks
          .using(key, () => sleep(60), { ...read, acquireTimeout: 5_000 })
          .catch(() => undefined);
      }
    };
    const loops = [0, 15, 30, 45].map(readerLoop);
    await sleep(200);
    // Without the preference the readers would keep the key for ever and this would time out.
    const writer = await env.locks.acquire(key, { acquireTimeout: 3_000 });
    await writer.release();
    stop = true;
    await Promise.all(loops);
  });

  it("a writer's first attempt already marks the key: a reader that asks before the writer's next attempt does not get in (found by mutation testing)", async () => {
    // The writer's app through a slow link (300 ms each way): its attempt once subscribed comes
    // ~900 ms after its first, a margin no stall of a loaded machine eats.
    const proxy = await FaultProxy.start(() => env.server.port);
    const slow = await startNonPollingApp({
      connection: `redis://127.0.0.1:${proxy.port}`,
      fenceRetention: 0,
    });
    const monitor = await monitorRedis(env.server.port);
    try {
      // Loaded: the writer's first attempt is one command, not NOSCRIPT and a second round trip.
      // (With fenceRetention 0 no block of fences is reserved: the unreserved script.)
      await env.redis.script('LOAD', ACQUIRE_UNRESERVED_SCRIPT);
      const key = uniqueKey('doc');
      const reader = await env.locks.acquire(key, read);
      proxy.setLatency(300);
      const writer = slow.locks.acquire(key, { acquireTimeout: 10_000 });
      writer.catch(() => {}); // (ends with the app if an assertion fails)
      // (The writer's script alone: the reader's check below runs another.)
      const writerAttempts = (): number =>
        scriptCalls(monitor.commands, ACQUIRE_UNRESERVED_SCRIPT, `lock:{${key}}`);
      assert.ok(await eventually(() => writerAttempts() >= 1), 'the writer never asked');
      // Its first attempt was refused (a reader holds the key) and is on its way back.
      assert.equal(await env.other.locks.tryAcquire(key, read), null, 'a reader got in');
      assert.equal(writerAttempts(), 1, 'the check came after the writer asked again');
      proxy.setLatency(0);
      await reader.release();
      await (await writer).release();
    } finally {
      monitor.stop();
      await slow.close();
      await proxy.close();
    }
  });

  it("a writer that waits longer than its mark's stay keeps new readers off: each of its attempts renews the mark (found by mutation testing)", async () => {
    // A mark lasts 2 × (retryInterval + retryJitter + commandTimeout): 2.3 s here, renewed every
    // ~150 ms: a stall of the writer's process would have to last 2 s to let a reader in.
    const quick = await startLockModule({
      connection: env.server.url,
      fenceRetention: 0,
      commandTimeout: 1_000,
      defaults: { retryInterval: 100, retryJitter: 50 },
    });
    try {
      const key = uniqueKey('doc');
      const reader = await env.locks.acquire(key, { ...read, ttl: 5_000 });
      const writer = quick.locks.acquire(key, { acquireTimeout: 10_000 });
      writer.catch(() => {}); // (ends with the app if an assertion fails)
      assert.ok(await eventually(() => waitingCallers(quick.locks, key) === 1), 'never waited');
      await sleep(2_800); // past the first attempt's mark
      assert.equal(await env.other.locks.tryAcquire(key, read), null, 'a new reader got in');
      await reader.release();
      await (await writer).release();
    } finally {
      await quick.close();
    }
  });

  it("a writer that only tries once, refused by readers, leaves a waiting writer's mark alone (found by mutation testing)", async () => {
    const key = uniqueKey('doc');
    const mark = (): Promise<number> => env.redis.hexists(`lock:{${key}}`, '');
    const reader = await env.other.locks.acquire(key, { ...read, ttl: 10_000 });
    // A writer that never polls within the test: it marks the key once, and never again.
    const app = await startNonPollingApp({ connection: env.server.url, fenceRetention: 0 });
    try {
      const writing = app.locks.acquire(key, { acquireTimeout: 10_000 });
      writing.catch(() => {}); // (ends with the app if an assertion fails)
      assert.ok(
        await eventually(async () => (await mark()) === 1),
        'the waiting writer left no mark',
      );
      assert.equal(await env.other.locks.tryAcquire(key), null);
      // Anything it sent after (a give-up) is written by the next turn of the event loop, and
      // runs before a command sent on its connection after that.
      await new Promise((resolve) => setImmediate(resolve));
      await env.other.locks.isLocked(key);
      assert.equal(await mark(), 1, "a refused tryAcquire() took the waiting writer's mark");
      assert.equal(await env.locks.tryAcquire(key, read), null, 'a new reader joined');
      await reader.release();
      await (await writing).release();
    } finally {
      await app.close();
    }
  });

  it('a waiting writer blocks new readers while it waits; one that gives up takes its mark back; readers already in may renew', async () => {
    const key = uniqueKey('doc');
    const mark = (): Promise<number> => env.redis.hexists(`lock:{${key}}`, '');
    const holder = await env.other.locks.acquire(key, { ...read, ttl: 10_000 });
    // A writer that only tries once leaves no mark: readers still join.
    assert.equal(await env.locks.tryAcquire(key), null);
    const alsoReading = (await env.locks.tryAcquire(key, read))!;
    assert.ok(alsoReading);
    await alsoReading.release();
    const writing = env.locks.acquire(key, { acquireTimeout: 1_500 });
    assert.ok(
      await eventually(async () => (await mark()) === 1),
      'the waiting writer left no mark',
    );
    assert.equal(
      await env.other.locks.tryAcquire(key, read),
      null,
      'held off by the writer’s mark',
    );
    await holder.extend(10_000); // the reader in keeps its lease
    await assert.rejects(writing, LockAcquireTimeoutError);
    // It gave up: its mark is taken back, and readers join at once (not when it lapses, 4.1 s on).
    assert.ok(await eventually(async () => (await mark()) === 0), 'the mark stayed');
    const joined = await env.other.locks.acquire(key, { ...read, acquireTimeout: 0 });
    await Promise.all([holder.release(), joined.release()]);
  });

  it('each reader’s lease is its own: a crashed reader frees its share after its TTL, a lost one is signalled', async () => {
    const key = uniqueKey('doc');
    const crashed = await env.other.locks.acquire(key, { ...read, ttl: 400 });
    const kept = await env.locks.acquire(key, { ...read, ttl: 10_000 });
    await sleep(500);
    await assert.rejects(crashed.extend(), LockLostError);
    assert.equal(await env.other.locks.tryAcquire(key), null, 'the live reader still holds it');
    await env.redis.hdel(`lock:{${key}}`, kept.token); // lost, as an eviction or a failover loses it
    const error = await kept.extend().catch((e: unknown) => e);
    assert.ok(error instanceof LockLostError && error.reason === 'not-held', String(error));
    assert.equal(kept.signal.aborted, true);
    const writer = await env.other.locks.acquire(key, { acquireTimeout: 1_000 });
    await writer.release();
  });

  it("leaves nothing after mixed use: a writer's release with only a reader of its own process waiting does not queue that process", async () => {
    const key = uniqueKey('doc');
    const writer = await env.locks.acquire(key, { ttl: 10_000 });
    const reader = env.locks.acquire(key, { ...read, acquireTimeout: 5_000 });
    // The reader waits (readers never join the queue of waiting processes).
    assert.ok(await eventually(() => waitingCallers(env.locks, key) === 1), 'it waits');
    await writer.release();
    await (await reader).release();
    // Queued by the writer's release, the process would stay there for its stay (~4 s): no
    // release of a reader takes it out.
    assert.deepEqual(await env.redis.keys(`lock:{${key}}*`), []);
  });

  it('a writer refused by maxWaiters as a reader of its process took the last place takes the process out of the queue of waiting processes (found by a helper)', async () => {
    const proxy = await FaultProxy.start(() => env.server.port);
    const app = await startNonPollingApp({
      connection: `redis://127.0.0.1:${proxy.port}`,
      fenceRetention: 0,
      maxWaiters: { perKey: 1 },
    });
    try {
      // Both scripts loaded (a NOSCRIPT detour would cost the reader two more trips).
      await (await app.locks.acquire(uniqueKey('doc'), read)).release();
      await (await app.locks.acquire(uniqueKey('doc'))).release();
      // A reader's attempt, then 300 ms later a writer's (nobody of the app waits yet: it may
      // wait), through a 300 ms/way link: the writer's queues the process in Redis; the reader,
      // refused, takes the one place ~300 ms before the writer's refusal arrives, which then
      // finds the places full. A machine that stood still long enough can let both answers in
      // at once, the writer's handled first: then the scenario did not happen, and it is tried
      // again (up to 3 times).
      let happened = false;
      for (let attempt = 0; attempt < 3 && !happened; attempt++) {
        const key = uniqueKey('doc');
        const held = await env.other.locks.acquire(key, { ttl: 30_000 });
        const gone = new AbortController();
        const options = { acquireTimeout: 30_000, signal: gone.signal };
        proxy.setLatency(300);
        const reader = app.locks.acquire(key, { ...read, ...options });
        await sleep(300);
        const writer = app.locks.acquire(key, options);
        const [writerRefused, readerRefused] = await Promise.race([
          Promise.allSettled([writer, reader]).then(() => [false, false]),
          writer.then(
            () => [false, false],
            (error: unknown) => [/already wait for this key/.test(String(error)), false],
          ),
          reader.then(
            () => [false, false],
            (error: unknown) => [false, /already wait for this key/.test(String(error))],
          ),
        ]);
        proxy.setLatency(0);
        happened = writerRefused;
        if (happened) {
          assert.equal(waitingCallers(app.locks, key), 1, 'the reader waits');
          await assertLeftTheQueue(`lock:{${key}}:turns`, held, reader);
        } else {
          assert.ok(readerRefused, 'neither the writer nor the reader was refused');
          gone.abort(new Error('tried again'));
          await Promise.allSettled([writer, reader]);
          await held.release();
        }
      }
      assert.ok(happened, 'in 3 tries the writer was never the one refused');
    } finally {
      proxy.setLatency(0);
      await app.close();
      await proxy.close();
    }
  });

  it('a writer that gives up while a reader of its process waits takes the process out of the queue of waiting processes (found by a helper)', async () => {
    const key = uniqueKey('doc');
    const app = await startNonPollingApp({ connection: env.server.url, fenceRetention: 0 });
    try {
      const held = await env.other.locks.acquire(key, { ttl: 30_000 });
      const writer = app.locks.acquire(key, { acquireTimeout: 500 });
      const reader = app.locks.acquire(key, { ...read, acquireTimeout: 30_000 });
      await assert.rejects(writer, LockAcquireTimeoutError);
      const turns = `lock:{${key}}:turns`;
      await assertLeftTheQueue(turns, held, reader);
    } finally {
      await app.close();
    }
  });

  it('a plain lock is a writer; semaphores and read locks on one key exclude each other', async () => {
    const key = uniqueKey('doc');
    const reader = await env.locks.acquire(key, read);
    assert.equal(await env.other.locks.tryAcquire(key, { limit: 3 }), null);
    await reader.release();
    const place = await env.locks.acquire(key, { limit: 3 });
    assert.equal(await env.other.locks.tryAcquire(key, read), null);
    await place.release();
  });

  it('re-enters in one call chain as the same shape; upgrading a read lock to write is a LockArgumentError', async () => {
    const key = uniqueKey('doc');
    await env.locks.using(
      key,
      async (outer: Lock) => {
        assert.equal(await env.locks.using(key, (inner) => inner.fence, read), outer.fence);
        await assert.rejects(
          env.locks.using(key, () => 1),
          LockArgumentError,
        );
      },
      read,
    );
    assert.equal(await env.locks.isLocked(key), false);
  });

  it('bad modes and mode with limit are a LockArgumentError naming them; on @WithLock a RedisLockConfigurationError', async () => {
    for (const mode of ['READ', 1, null, '']) {
      const error = await env.locks
        .acquire(uniqueKey(), { mode: mode as 'read' })
        .catch((e: unknown) => e);
      assert.ok(error instanceof LockArgumentError && error.argument === 'mode', String(error));
    }
    const both = await env.locks.acquire(uniqueKey(), { mode: 'read', limit: 2 }).catch((e) => e);
    assert.ok(both instanceof LockArgumentError && both.argument === 'mode + limit', String(both));
    for (const options of [
      { key: 'k', mode: 'shared' as never },
      { key: 'k', mode: 'read', limit: 3 },
    ] as const) {
      assert.throws(
        () => WithLock(options)(class Docs {}.prototype, 'read', { value: async () => 1 }),
        RedisLockConfigurationError,
      );
    }
  });

  it("re-acquiring a read lock with the caller's own token that reads returns the same fence; a new read lock a new one", async () => {
    await assertOwnTokenKeepsFence(env, { mode: 'read' as const });
  });

  describe('a writer is not starved by readers that keep coming', () => {
    /**
     * Read locks of `ttl` taken through `locks` every 100 ms and never released (they expire: no
     * release message wakes the writer), so that some are always held, until `stop()`.
     */
    const readerStream = (
      locks: LockService,
      key: string,
      ttl: number,
    ): { stop(): Promise<void> } => {
      let running = true;
      const loop = (async () => {
        while (running) {
          await locks.tryAcquire(key, { ...read, ttl });
          await sleep(100);
        }
      })();
      return {
        stop: async () => {
          running = false;
          await loop;
        },
      };
    };

    for (const [name, writer] of [
      ['a writer with a short TTL (its mark outlasts its pause between attempts)', { ttl: 300 }],
      ['a fair writer (it marks the readers too)', { ttl: 300, fair: true }],
    ] as const) {
      it(name, async () => {
        const key = uniqueKey('doc');
        const stream = readerStream(env.other.locks, key, 900);
        try {
          await sleep(300); // readers overlapping
          // Readers already in finish within 900 ms; none joins behind the writer's mark.
          const lock = await env.locks.acquire(key, { ...writer, acquireTimeout: 6_000 });
          assert.equal(await env.other.locks.tryAcquire(key, read), null);
          await lock.release();
        } finally {
          await stream.stop();
        }
      });
    }
  });
});
