import assert from 'node:assert/strict';
import { describe, it } from 'node:test';

import {
  eventually,
  LogCapture,
  sleep,
  startLockModule,
  twoAppsOnOneRedis,
  uniqueKey,
  type LockModuleFixture,
} from '../support/lock-module.js';
import {
  LockAcquireTimeoutError,
  LockBackendError,
  LockLostError,
  type Lock,
} from '../../lib/index.js';
import { FaultProxy } from '../support/fault-proxy.js';
import { assertWithin, watchStalls } from '../support/timing.js';

/**
 * One live holder per key, on the engine's edges: a lock passed on in the process, a re-entered
 * lock released twice, several keys waited for one after another. A live holder is one whose
 * `signal` has not aborted.
 */
describe('never two live holders', () => {
  const env = twoAppsOnOneRedis();

  /** Until this process's waiter on `key` has subscribed to its releases (then one more try). */
  const subscribed = async (key: string): Promise<void> => {
    const channel = `lock:{${key}}:released`;
    const count = async (): Promise<number> =>
      Number(((await env.redis.pubsub('NUMSUB', channel)) as [string, number])[1]);
    assert.ok(await eventually(async () => (await count()) > 0), `nobody subscribed to ${channel}`);
    await sleep(50);
  };

  /**
   * Runs `fn` with an app whose connection goes through a fault proxy (`commandTimeout` as given),
   * then closes both, the proxy healed and without latency.
   */
  async function throughProxy(
    commandTimeout: number,
    fn: (slow: LockModuleFixture, proxy: FaultProxy) => Promise<void>,
  ): Promise<void> {
    const proxy = await FaultProxy.start(() => env.server.port);
    const slow = await startLockModule({
      connection: `redis://127.0.0.1:${proxy.port}`,
      commandTimeout,
    });
    try {
      await fn(slow, proxy);
    } finally {
      proxy.setLatency(0);
      proxy.heal();
      await slow.close();
      await proxy.close();
    }
  }

  it("a lock passed on in the process lives by the heir's TTL, not the releaser's lease", async () => {
    await throughProxy(5_000, async (slow, proxy) => {
      const key = uniqueKey();
      const releaser = await slow.locks.acquire(key, { ttl: 30_000 });
      const heirPending = slow.locks.acquire(key, { ttl: 300, acquireTimeout: 10_000 });
      await subscribed(key);
      // The heir's own write (PASS_ON) reaches Redis a second late and is answered two late.
      proxy.setLatency(1_000);
      const released = releaser.release();
      const heir = await heirPending;
      // Passed on in the process: Redis still holds the releaser's token.
      assert.equal(await env.redis.get(`lock:{${key}}`), releaser.token);
      assert.equal(heir.fence, releaser.fence + 1);
      const lease = heir.expiresAt - performance.now();
      assert.ok(lease <= 300, `the heir's lease: ${lease.toFixed(0)} ms for a 300 ms TTL`);
      const { signal } = heir;
      // Redis runs the heir's TTL from when PASS_ON lands; then another app takes the key.
      let taken = null;
      const deadline = performance.now() + 5_000;
      while (!taken && performance.now() < deadline) {
        taken = await env.other.locks.tryAcquire(key, { ttl: 10_000 });
        if (!taken) await sleep(20);
      }
      assert.ok(taken, 'the key never expired in Redis');
      assert.equal(signal.aborted, true, 'two live holders: the heir still believes it holds');
      await taken.release();
      assert.equal(await released, true);
    });
  });

  it("extend() of a lock passed on in its process, whose own write gets no answer, fails within twice commandTimeout with LockBackendError('extend')", async () => {
    const commandTimeout = 400;
    await throughProxy(commandTimeout, async (slow, proxy) => {
      const key = uniqueKey();
      const releaser = await slow.locks.acquire(key, { ttl: 30_000 });
      const heirPending = slow.locks.acquire(key, { ttl: 30_000, acquireTimeout: 10_000 });
      await subscribed(key);
      // The heir's own token write (PASS_ON) goes out into a partition: never answered.
      proxy.stall();
      // The release sent that write: with no answer it fails within commandTimeout too.
      const released = releaser.release().catch((failure: unknown) => failure);
      const heir = await heirPending;
      assert.equal(heir.fence, releaser.fence + 1, 'passed on in the process');
      const watch = watchStalls();
      const started = performance.now();
      const error = await heir.extend().then(
        () => assert.fail('extended with no answer from Redis'),
        (failure: unknown) => failure,
      );
      const took = performance.now() - started;
      assert.ok(error instanceof LockBackendError, String(error));
      assert.deepEqual([error.operation, error.timedOut], ['extend', true]);
      assertWithin(
        took,
        2 * commandTimeout,
        watch,
        'extend() of a passed-on lock Redis never answers',
      );
      watch.stop();
      const release = await released;
      assert.ok(
        release === true || (release instanceof LockBackendError && release.timedOut),
        String(release),
      );
      proxy.heal();
      await heir.release().catch(() => false);
    });
  });

  /**
   * A lock passed on in the process: `releaser` held `key` through `slow` (its own TTL
   * `releaserTtl`), a waiter of the same app with `heirOptions` was handed it by the release, and
   * `before` ran between the release and the handover (the proxy's faults). The heir's own token
   * write goes out behind it.
   */
  async function passOn(
    slow: LockModuleFixture,
    releaserTtl: number,
    heirOptions: { ttl: number; autoExtend: boolean },
    before: () => void,
  ): Promise<{ key: string; releaser: Lock; heir: Lock; released: Promise<unknown> }> {
    const key = uniqueKey();
    const releaser = await slow.locks.acquire(key, { ttl: releaserTtl });
    const heirPending = slow.locks.acquire(key, { ...heirOptions, acquireTimeout: 10_000 });
    await subscribed(key);
    before();
    const released = releaser.release().catch((failure: unknown) => failure);
    const heir = await heirPending;
    assert.equal(heir.fence, releaser.fence + 1, 'passed on in the process');
    return { key, releaser, heir, released };
  }

  it("a lock passed on in its process runs by its own TTL once Redis confirms its token write, not by its predecessor's lease", async () => {
    await throughProxy(5_000, async (slow, proxy) => {
      // Passed on in the process only with at least half the heir's TTL left of the releaser's
      // lease: 30 s left of it for a 50 s TTL.
      const { key, heir, released } = await passOn(
        slow,
        30_000,
        { ttl: 50_000, autoExtend: false },
        () => proxy.setLatency(100),
      );
      // On its predecessor's lease until the write is answered: under 30 s left.
      assert.ok(heir.expiresAt - performance.now() <= 30_000, 'started on its own TTL');
      assert.ok(
        await eventually(() => heir.expiresAt - performance.now() > 40_000, 5_000),
        `the confirmed write did not give the heir its own 50 s TTL (${(heir.expiresAt - performance.now()).toFixed(0)} ms left)`,
      );
      assert.equal(await env.redis.get(`lock:{${key}}`), heir.token);
      assert.ok((await env.redis.pttl(`lock:{${key}}`)) > 40_000);
      proxy.setLatency(0);
      await released;
      assert.equal(heir.signal.aborted, false);
      assert.equal(await heir.release(), true);
    });
  });

  it('a lock passed on in its process keeps its watchdog after its token write is confirmed', async () => {
    await throughProxy(5_000, async (slow, proxy) => {
      const { key, heir, released } = await passOn(
        slow,
        30_000,
        { ttl: 600, autoExtend: true },
        () => proxy.setLatency(100),
      );
      assert.ok(
        await eventually(async () => (await env.redis.get(`lock:{${key}}`)) === heir.token, 5_000),
        "the heir's token write never landed",
      );
      proxy.setLatency(0);
      await released;
      // Several of its 600 ms TTLs: only its watchdog keeps it.
      await sleep(2_000);
      assert.equal(heir.signal.aborted, false, 'never told lost, yet not extended');
      assert.equal(await env.redis.get(`lock:{${key}}`), heir.token, 'its watchdog stopped');
      assert.equal(await heir.release(), true);
    });
  });

  it('a lock passed on in its process whose token write finds the lock taken from its predecessor is lost at once (not-held), not at the end of the lease', async () => {
    await throughProxy(5_000, async (slow, proxy) => {
      const { key, heir, released } = await passOn(
        slow,
        30_000,
        { ttl: 30_000, autoExtend: false },
        () => proxy.setLatency(300),
      );
      const { signal } = heir;
      // Before the heir's write lands, the key is freed and taken by another holder.
      await env.redis.set(`lock:{${key}}`, 'someone-else', 'PX', 30_000);
      const watch = watchStalls();
      const started = performance.now();
      await new Promise((resolve) => signal.addEventListener('abort', resolve, { once: true }));
      // The write's round trip through the 300 ms/way link, and no more.
      assertWithin(performance.now() - started, 600, watch, 'the loss of the refused heir');
      watch.stop();
      assert.ok(signal.reason instanceof LockLostError, String(signal.reason));
      assert.equal(signal.reason.reason, 'not-held');
      assert.equal(await env.redis.get(`lock:{${key}}`), 'someone-else', 'the heir wrote over it');
      await released;
      await env.redis.del(`lock:{${key}}`);
    });
  });

  it('a lock passed on in its process whose token write gets no answer runs out on its lease, lost with the timeout as its cause', async () => {
    await throughProxy(300, async (slow, proxy) => {
      const { heir, released } = await passOn(slow, 30_000, { ttl: 1_000, autoExtend: false }, () =>
        proxy.stall(),
      );
      const { signal } = heir;
      await new Promise((resolve) => signal.addEventListener('abort', resolve, { once: true }));
      assert.ok(signal.reason instanceof LockLostError, String(signal.reason));
      assert.equal(signal.reason.reason, 'expired');
      const cause = signal.reason.cause;
      assert.ok(cause instanceof LockBackendError, `cause: ${String(cause)}`);
      assert.deepEqual([cause.operation, cause.timedOut], ['extend', true]);
      proxy.heal();
      await released;
    });
  });

  it('a watched lock passed on in its process whose token write gets no answer goes on trying, and keeps the lock once the link heals', async () => {
    await throughProxy(300, async (slow, proxy) => {
      const { key, heir, released } = await passOn(
        slow,
        30_000,
        { ttl: 1_500, autoExtend: true },
        () => proxy.stall(),
      );
      const { signal } = heir;
      // Past commandTimeout: the write counts as unanswered; then the link heals (the write lands).
      await sleep(600);
      assert.equal(signal.aborted, false);
      proxy.heal();
      await released;
      // Past its 1.5 s lease: kept only if the watchdog went on after the unanswered write.
      await sleep(2_000);
      assert.equal(signal.aborted, false, String(signal.reason));
      assert.equal(await env.redis.get(`lock:{${key}}`), heir.token);
      assert.equal(await heir.release(), true);
    });
  });

  it('an unwatched lock passed on in its process gets no watchdog from its token write, answered or not: it runs out at its TTL (found by mutation testing)', async () => {
    await throughProxy(300, async (slow, proxy) => {
      // Answered: confirmed on its own 600 ms TTL, then left to run out.
      const confirmed = await passOn(slow, 30_000, { ttl: 600, autoExtend: false }, () =>
        proxy.setLatency(20),
      );
      const { signal } = confirmed.heir;
      assert.ok(await eventually(() => signal.aborted, 3_000), 'kept past its TTL: extended');
      assert.equal((signal.reason as LockLostError).reason, 'expired');
      // Redis runs its TTL from when the write landed: a little after the lease's start here.
      assert.ok(
        await eventually(
          async () => (await env.redis.exists(`lock:{${confirmed.key}}`)) === 0,
          500,
        ),
        'extended in Redis',
      );
      proxy.setLatency(0);
      await confirmed.released;

      // Unanswered, then the link heals before its 1.5 s lease is over: still nothing extends it.
      const unanswered = await passOn(slow, 30_000, { ttl: 1_500, autoExtend: false }, () =>
        proxy.stall(),
      );
      const lost = unanswered.heir.signal;
      await sleep(600); // past commandTimeout: the write counts as unanswered
      proxy.heal();
      await unanswered.released;
      assert.ok(await eventually(() => lost.aborted, 3_000), 'kept past its TTL: extended');
      assert.equal((lost.reason as LockLostError).reason, 'expired');
      assert.ok(
        await eventually(
          async () => (await env.redis.exists(`lock:{${unanswered.key}}`)) === 0,
          2_000,
        ),
        'extended in Redis',
      );
    });
  });

  it('a grant whose answer comes after its lease ran out is not a lock: the attempt counts as failed', async () => {
    await throughProxy(5_000, async (slow, proxy) => {
      await (await slow.locks.acquire(uniqueKey())).release(); // a warm connection
      // A 300 ms round trip against a 250 ms TTL: every grant arrives after its lease.
      proxy.setLatency(150);
      assert.equal(await slow.locks.tryAcquire(uniqueKey(), { ttl: 250 }), null);
      await assert.rejects(
        slow.locks.acquire(uniqueKey(), { ttl: 250, acquireTimeout: 0 }),
        (error) => error instanceof LockAcquireTimeoutError,
      );
      // With a longer TTL the same link gives a lock with its lease still running.
      const lock = await slow.locks.acquire(uniqueKey(), { ttl: 2_000, acquireTimeout: 0 });
      assert.ok(lock.expiresAt > performance.now() && !lock.signal.aborted);
      await lock.release();
    });
  });

  it("a lock passed on to a waiter whose continuation comes after its lease ran out is given back after the heir's own token write, never before it", async () => {
    // Replies are given more time than the event loop is held up below.
    const app = await startLockModule({ connection: env.server.url, commandTimeout: 5_000 });
    try {
      const key = uniqueKey();
      // Most of the releaser's 2 s lease left, at least half the heir's 1 s TTL: passed on in the
      // process, with the heir's own token write sent right behind; the heir's lease is its own
      // TTL's (~990 ms).
      const releaser = await app.locks.acquire(key, { ttl: 2_000 });
      const heir = app.locks.acquire(key, { ttl: 1_000, acquireTimeout: 400 });
      heir.catch(() => {}); // asserted below
      await subscribed(key);
      const released = releaser.release();
      // The heir's continuation runs only after its lease is over: its grant is late, and
      // undone. Sent before the token write, the undo found the releaser's token, and the write
      // then left the heir's lock in Redis for a second, held by nobody.
      const until = performance.now() + 1_100;
      while (performance.now() < until); // the event loop held up, as on a stalled machine
      await assert.rejects(heir, LockAcquireTimeoutError);
      assert.equal(await released, true);
      assert.ok(
        await eventually(async () => (await env.redis.exists(`lock:{${key}}`)) === 0, 400),
        'a lock nobody holds stayed in Redis',
      );
    } finally {
      await app.close();
    }
  });

  it('shutdown with an attempt in flight leaves nothing: its late grant is undone before the connection closes', async () => {
    const proxy = await FaultProxy.start(() => env.server.port);
    const slow = await startLockModule({
      connection: `redis://127.0.0.1:${proxy.port}`,
      commandTimeout: 2_000,
    });
    const { capture, restore } = LogCapture.install();
    try {
      await (await slow.locks.acquire(uniqueKey())).release(); // a warm connection
      const key = uniqueKey();
      // A 300 ms round trip: the attempt is on its way when the app closes.
      proxy.setLatency(150);
      const pending = slow.locks.acquire(key, { ttl: 20_000 });
      pending.catch(() => {}); // awaited below
      await sleep(20);
      await slow.close();
      await assert.rejects(pending, { name: 'RedisLockShutdownError' });
      // Redis granted the attempt; the undo ran before the QUIT.
      assert.equal(await env.redis.exists(`lock:{${key}}`), 0, 'the late grant stayed in Redis');
      assert.deepEqual(
        capture.lines.filter(({ message }) => message.includes('abandoned attempt')),
        [],
        'an undo that fits is not warned about',
      );
    } finally {
      restore();
      proxy.setLatency(0);
      await slow.close();
      await proxy.close();
    }
  });

  it('shutdown whose deadline passes before an attempt in flight is answered says so: its late grant stays until its TTL', async () => {
    const proxy = await FaultProxy.start(() => env.server.port);
    const slow = await startLockModule({
      connection: `redis://127.0.0.1:${proxy.port}`,
      commandTimeout: 200,
    });
    const { capture, restore } = LogCapture.install();
    try {
      await (await slow.locks.acquire(uniqueKey())).release(); // a warm connection
      const key = uniqueKey();
      // A 500 ms round trip, over shutdown's deadline of 2 × 200 ms.
      proxy.setLatency(250);
      const pending = slow.locks.acquire(key, { ttl: 20_000 });
      pending.catch(() => {}); // awaited below
      await sleep(20);
      await slow.close();
      await assert.rejects(pending, { name: 'RedisLockShutdownError' });
      const said = capture.lines.filter(({ message }) => message.includes('abandoned attempt'));
      assert.equal(said.length, 1, JSON.stringify(capture.lines));
      assert.match(
        said[0].message,
        new RegExp(`passed before Redis answered an abandoned attempt on "${key}"`),
      );
      assert.ok(
        await eventually(async () => (await env.redis.exists(`lock:{${key}}`)) === 1, 1_000),
        'the attempt reached Redis and was granted (what the warning is about)',
      );
    } finally {
      restore();
      proxy.setLatency(0);
      await slow.close();
      await proxy.close();
    }
  });

  describe('a re-entered lock', () => {
    it('is a view of the outer hold: releasing it twice answers true, then false, and never frees the outer lock', async () => {
      const key = uniqueKey();
      await env.locks.using(key, async (outer) => {
        const inner = await env.locks.acquire(key);
        assert.notEqual(inner, outer);
        assert.equal(inner.token, outer.token);
        assert.equal(inner.fence, outer.fence);
        assert.equal(await inner.release(), true);
        assert.equal(await inner.release(), false);
        assert.equal(await env.locks.release(inner), false);
        // The outer hold is untouched: still in Redis, still excluding everyone else.
        assert.equal(await env.redis.get(`lock:{${key}}`), outer.token);
        assert.equal(await env.other.locks.tryAcquire(key), null);
        assert.equal(outer.signal.aborted, false);
        await assert.rejects(inner.extend(), { name: 'LockLostError', reason: 'not-held' });
        // A nested call after it re-enters again.
        await env.locks.using(key, async (again) => {
          assert.equal(again.fence, outer.fence);
        });
        assert.equal(await env.other.locks.tryAcquire(key), null);
      });
      assert.equal(await env.redis.exists(`lock:{${key}}`), 0);
    });

    it('is ended with the outer hold, forgotten or not: the key goes when the outermost use ends', async () => {
      const key = uniqueKey();
      let view: Lock | undefined;
      await env.locks.using(key, async () => {
        view = await env.locks.acquire(key); // never released
      });
      assert.equal(await env.redis.exists(`lock:{${key}}`), 0);
      assert.equal(await view!.release(), false);
      const next = await env.other.locks.tryAcquire(key);
      assert.ok(next, 'the key stayed held after its outermost use ended');
      await next.release();
    });

    it('extends the outer lock while open', async () => {
      const key = uniqueKey();
      await env.locks.using(
        key,
        async (outer) => {
          await env.locks.using(key, async (inner) => {
            await inner.extend(20_000);
          });
          const pttl = await env.redis.pttl(`lock:{${key}}`);
          assert.ok(pttl > 15_000, `PTTL ${pttl}`);
          assert.ok(outer.expiresAt > performance.now() + 15_000);
        },
        { ttl: 5_000, autoExtend: false },
      );
    });
  });

  describe('several keys', () => {
    /** Whether `lock` holds every one of its keys in Redis, each with time left. */
    const allHeld = async (lock: Lock): Promise<boolean> => {
      for (const key of lock.keys) {
        const [owner, pttl] = await Promise.all([
          env.redis.get(`lock:{${key}}`),
          env.redis.pttl(`lock:{${key}}`),
        ]);
        if (owner !== lock.token || pttl <= 0) return false;
      }
      return true;
    };

    it('never resolve after an earlier key ran out: a later key that frees near the end of its lease is not waited for', async () => {
      for (let round = 0; round < 5; round++) {
        const [a, b] = [uniqueKey('a'), uniqueKey('b')];
        // Someone else's lock on b, with no TTL to wait by, goes at 250 ms without a release
        // message (deleted): the waiter for b sleeps to the end of its wait, then tries.
        await env.redis.set(`lock:{${b}}`, 'someone');
        const freed = sleep(250).then(() => env.redis.del(`lock:{${b}}`));
        const outcome: unknown = await env.locks
          .acquire([a, b], { ttl: 300, acquireTimeout: 5_000 })
          .catch((error: unknown) => error);
        if (outcome instanceof Error) {
          assert.ok(outcome instanceof LockAcquireTimeoutError, String(outcome));
        } else {
          const lock = outcome as Lock;
          assert.ok(lock.expiresAt > performance.now(), 'resolved on a lease already over');
          assert.ok(await allHeld(lock), `round ${round}: resolved without holding every key`);
          await lock.release();
        }
        await freed;
        // Nothing kept: a is free again.
        assert.equal(await env.redis.exists(`lock:{${a}}`), 0);
      }
    });

    it("check every key's lease before resolving: a reply that lands after an earlier key ran out fails the call and keeps nothing", async () => {
      await throughProxy(5_000, async (slow, proxy) => {
        const [a, b] = [uniqueKey('a'), uniqueKey('b')];
        // With a caller's own token the keys go one by one; a's lease is shorter than the round
        // trip that takes it and then b, so b's grant arrives after a ran out.
        await (await slow.locks.acquire(uniqueKey())).release(); // a warm connection
        proxy.setLatency(150);
        await assert.rejects(
          slow.locks.acquire([a, b], { ttl: 400, token: 'mine', acquireTimeout: 0 }),
          (error) => error instanceof LockAcquireTimeoutError,
        );
        proxy.setLatency(0);
        assert.ok(
          await eventually(
            async () => (await env.redis.exists(`lock:{${a}}`, `lock:{${b}}`)) === 0,
          ),
          'a key was kept',
        );
      });
    });

    it('fail within one commandTimeout when Redis stops answering between keys: the undo is not waited for', async () => {
      await throughProxy(1_000, async (slow, proxy) => {
        // After compile(): the testing module installs its own logger.
        const { capture, restore } = LogCapture.install();
        try {
          const [a, b] = [uniqueKey('a'), uniqueKey('b')];
          // With its own token the call takes a, then b: the partition starts as a is granted.
          const seen = slow.locks.events.subscribe((event) => {
            if (event.type === 'acquired' && event.key === a) proxy.stall();
          });
          const failure = await slow.locks.tryAcquire([a, b], { token: 'mine' }).then(
            () => undefined,
            (error: unknown) => error,
          );
          seen.unsubscribe();
          assert.ok(failure instanceof LockBackendError && failure.timedOut, String(failure));
          // Failed before the undo of a (its release, as unanswered) had run out its own bound.
          assert.ok(
            !capture.lines.some(({ message }) => message.includes('could not release')),
            'the call waited for the undo of the keys it had taken',
          );
          proxy.heal();
          assert.ok(
            await eventually(async () => (await env.redis.exists(`lock:{${a}}`)) === 0),
            'a was kept',
          );
        } finally {
          restore();
        }
      });
    });
  });
});
