import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import {
  getCurrentLock,
  LockAcquireAbortedError,
  LockAcquireTimeoutError,
  LockArgumentError,
  LockBackendError,
  LockLostError,
  type AcquireOptions,
  type Lock,
  type LockEvent,
} from '../../lib/index.js';
import { SKIP_WHEN_BUSY } from '../../lib/options/acquire-options.js';
import {
  eventually,
  sleep,
  startLockModule,
  startNonPollingApp,
  waitingCallers,
  twoAppsOnOneRedis,
  uniqueKey,
} from '../support/lock-module.js';
import { FaultProxy } from '../support/fault-proxy.js';
import { assertWithin, watchStalls } from '../support/timing.js';
import {
  monitorRedis,
  scriptCalls,
  scriptCallsOf,
  type MonitoredCommand,
} from '../support/redis-monitor.js';
import {
  ACQUIRE_ALL_SCRIPT,
  ACQUIRE_SCRIPT,
  RELEASE_SCRIPT,
} from '../../lib/redis/lock.scripts.js';

describe('several keys at once (acquire([a, b]))', () => {
  const env = twoAppsOnOneRedis();

  /** Two fresh keys, sorted as the lock sorts them. */
  const pair = (): [string, string] => {
    const keys = [uniqueKey('acct'), uniqueKey('acct')].sort();
    return [keys[0], keys[1]];
  };
  const stored = (key: string): Promise<string | null> => env.redis.get(`lock:{${key}}`);

  /** `key` is gone from Redis within `ttl` from now (and what the machine added), unreleased. */
  async function lapsesWithin(key: string, ttl: number, what: string): Promise<void> {
    const from = performance.now();
    const stalls = watchStalls();
    assert.ok(
      await eventually(async () => (await stored(key)) === null, 3 * ttl),
      `${key} kept alive by its watchdog: PTTL ${await env.redis.pttl(`lock:{${key}}`)} ms`,
    );
    assertWithin(performance.now() - from, ttl, stalls, what);
    stalls.stop();
  }

  it('locks every key with one token, lists them in lock order, and gives each its own fence', async () => {
    const [a, b] = pair();
    const earlier = await env.locks.acquire(b);
    await earlier.release();
    const lock = await env.locks.acquire([b, a], { ttl: 5_000 });
    assert.deepEqual(lock.keys, [a, b]);
    assert.equal(lock.key, a);
    assert.equal(await stored(a), lock.token);
    assert.equal(await stored(b), lock.token);
    assert.equal(lock.fence, lock.fences[a]);
    assert.ok(lock.fences[b] > earlier.fence, 'each key’s fence grows on its own');
    assert.ok(lock.expiresAt <= performance.now() + 5_000);
    assert.equal(await env.locks.isLocked(a), true);
    assert.equal(await env.locks.isLocked(b), true);

    await lock.extend(8_000);
    assert.ok((await env.redis.pttl(`lock:{${b}}`)) > 6_000);
    assert.equal(await lock.release(), true);
    assert.equal(await env.locks.isLocked(a), false);
    assert.equal(await env.locks.isLocked(b), false);
    assert.equal(await lock.release(), false);
  });

  it("your own token that holds several keys gets each key's fence again, from either app, and the next holder greater ones; nothing stays", async () => {
    const [a, b] = pair();
    const mine = await env.locks.acquire([a, b], { token: 'mine', ttl: 10_000 });
    for (const locks of [env.locks, env.other.locks]) {
      const again = await locks.acquire([b, a], { token: 'mine', ttl: 10_000 });
      assert.deepEqual(again.fences, mine.fences, 'the same fences for the token holding them');
    }
    // One key of the two taken by someone else meanwhile: that key's fence is a new one.
    assert.equal(await mine.release(), true);
    const theirs = await env.other.locks.acquire(b);
    await theirs.release();
    const next = await env.locks.acquire([a, b], { token: 'mine' });
    assert.ok(next.fences[a] > mine.fences[a], `${a}: ${next.fences[a]} after ${mine.fences[a]}`);
    assert.ok(next.fences[b] > theirs.fence, `${b}: ${next.fences[b]} after ${theirs.fence}`);
    assert.equal(await next.release(), true);
    for (const key of [a, b]) assert.deepEqual(await env.redis.keys(`lock:{${key}}*`), []);
  });

  it('takes free keys in one script, one round trip; when one is taken, goes key by key in order', async () => {
    const [a, b] = pair();
    const monitor = await monitorRedis(env.server.port);
    try {
      const lock = await env.locks.acquire([b, a]);
      await sleep(100); // MONITOR reports what ran, a moment later
      assert.equal(scriptCalls(monitor.commands, ACQUIRE_ALL_SCRIPT, `lock:{${a}}`), 1);
      for (const key of [a, b]) {
        assert.equal(scriptCalls(monitor.commands, ACQUIRE_SCRIPT, `lock:{${key}}`), 0);
      }
      assert.equal(await stored(b), lock.token);
      assert.ok(lock.fences[a] > 0 && lock.fences[b] > 0);
      await lock.release();

      const holder = await env.other.locks.acquire(b);
      const waiting = env.locks.acquire([a, b], { acquireTimeout: 3_000 });
      await sleep(100);
      assert.equal(await env.locks.isLocked(a), true, 'a is held while b is awaited');
      assert.equal(scriptCalls(monitor.commands, ACQUIRE_ALL_SCRIPT, `lock:{${a}}`), 2);
      await holder.release();
      const both = await waiting;
      assert.ok(both.fences[b] > holder.fence);
      await both.release();
    } finally {
      monitor.stop();
    }
  });

  it('takes none when one key stays taken: the keys taken before it are released (acquire and tryAcquire)', async () => {
    const [a, b] = pair();
    const holder = await env.other.locks.acquire(b, { ttl: 10_000 });
    const watch = watchStalls();
    const started = performance.now();
    const error = await env.locks.acquire([a, b], { acquireTimeout: 300 }).catch((e: unknown) => e);
    assert.ok(error instanceof LockAcquireTimeoutError, String(error));
    assert.equal(error.key, b);
    assert.equal(error.acquireTimeout, 300);
    assert.ok(error.waitedMs >= 290, `waited ${error.waitedMs}`);
    assert.ok(error.waitedMs <= performance.now() - started, `waited ${error.waitedMs}`);
    assertWithin(performance.now() - started, 300, watch, 'acquire([a, b])');
    watch.stop();
    assert.equal(await env.locks.isLocked(a), false, 'the first key was given back');

    assert.equal(await env.locks.tryAcquire([a, b]), null);
    assert.equal(await env.locks.isLocked(a), false);
    // The other order names the same keys: the same answer.
    assert.equal(await env.locks.tryAcquire([b, a]), null);
    assert.equal(await env.locks.isLocked(a), false);
    await holder.release();
    const lock = (await env.locks.tryAcquire([b, a]))!;
    assert.deepEqual(lock.keys, [a, b]);
    await lock.release();
  });

  it('never deadlocks against a caller naming the same keys in the other order (control: taking them in the order given does)', async () => {
    const [a, b] = pair();
    // Control: each side takes its first key, then waits for the other's.
    const first = await Promise.all([env.locks.acquire(a), env.other.locks.acquire(b)]);
    const crossed = await Promise.allSettled([
      env.locks.acquire(b, { acquireTimeout: 300 }),
      env.other.locks.acquire(a, { acquireTimeout: 300 }),
    ]);
    assert.ok(crossed.every((result) => result.status === 'rejected'));
    await Promise.all(first.map((lock) => lock.release()));

    // The same race through acquire([..]): every round completes, one holder at a time.
    let inside = 0;
    let overlaps = 0;
    const work = async (): Promise<void> => {
      if (inside++ > 0) overlaps++;
      await sleep(2);
      inside--;
    };
    const started = performance.now();
    await Promise.all(
      Array.from({ length: 20 }, (_, i) =>
        i % 2 === 0
          ? env.locks.using([a, b], work, { acquireTimeout: 10_000 })
          : env.other.locks.using([b, a], work, { acquireTimeout: 10_000 }),
      ),
    );
    assert.equal(overlaps, 0);
    assert.ok(performance.now() - started < 5_000, 'no round waited out a timeout');
  });

  it('without auto-extension, a wait cut short by the leases of the keys held gives them back and takes the whole set again, until acquireTimeout', async () => {
    const [a, b] = pair();
    const holder = await env.other.locks.acquire(b, { ttl: 5_000 });
    // Freed after 250 ms: well past what a's 300 ms lease lets the first round wait for b.
    setTimeout(() => void holder.release(), 250);
    const started = performance.now();
    const lock = await env.locks.acquire([a, b], {
      ttl: 300,
      acquireTimeout: 5_000,
      autoExtend: false,
    });
    try {
      assert.ok(performance.now() - started >= 240, 'granted while b was still held');
      assert.ok(lock.fences[b] > holder.fence);
      assert.ok(lock.expiresAt > performance.now(), 'a key of the lock had lapsed already');
      assert.equal(await stored(a), lock.token);
      assert.equal(await stored(b), lock.token);
    } finally {
      await lock.release();
    }
  });

  it('without auto-extension, a key that stays taken fails the call at acquireTimeout, not before, giving back the keys taken meanwhile', async () => {
    const [a, b] = pair();
    const holder = await env.other.locks.acquire(b, { ttl: 5_000 });
    const events: LockEvent[] = [];
    const subscription = env.locks.events.subscribe((event) => events.push(event));
    try {
      const error = await env.locks
        .acquire([a, b], { ttl: 300, acquireTimeout: 1_000 })
        .catch((e: unknown) => e);
      assert.ok(error instanceof LockAcquireTimeoutError, String(error));
      assert.equal(error.key, b);
      assert.equal(error.busy, true);
      assert.ok(error.waitedMs >= 1_000, `gave up after ${error.waitedMs.toFixed(0)} ms`);
      assert.equal(await env.locks.isLocked(a), false);
      assert.deepEqual(
        events.filter((event) => event.type === 'timeout').map((event) => event.key),
        [b],
        'one timeout event for the call',
      );
    } finally {
      subscription.unsubscribe();
      await holder.release();
    }
  });

  it('an abort during the one-step attempt of free keys rejects with LockAcquireAbortedError, as a wait for one key does (found by the model suite)', async () => {
    const proxy = await FaultProxy.start(() => env.server.port);
    const slow = await startLockModule({ connection: `redis://127.0.0.1:${proxy.port}` });
    try {
      await slow.locks.isLocked(uniqueKey()); // a connection, before the latency
      proxy.setLatency(100);
      const controller = new AbortController();
      const pending = slow.locks.acquire(pair(), { signal: controller.signal });
      setTimeout(() => controller.abort(new Error('the client went away')), 20);
      await assert.rejects(pending, (error) => error instanceof LockAcquireAbortedError);
    } finally {
      proxy.setLatency(0);
      await slow.close();
      await proxy.close();
    }
  });

  it('a one-step attempt whose reply comes after commandTimeout fails, and its late grant of every key is undone when it lands (found by mutation testing)', async () => {
    const proxy = await FaultProxy.start(() => env.server.port);
    const slow = await startLockModule({
      connection: `redis://127.0.0.1:${proxy.port}`,
      commandTimeout: 300,
    });
    try {
      await slow.locks.isLocked(uniqueKey()); // a connection, before the latency
      proxy.setLatency(250); // a 500 ms round trip: the reply comes after commandTimeout
      const [a, b] = pair();
      const stalls = watchStalls();
      const started = performance.now();
      const error = await slow.locks.acquire([a, b], { ttl: 30_000, acquireTimeout: 0 }).then(
        () => assert.fail('granted with no reply within commandTimeout'),
        (e: unknown) => e,
      );
      assert.ok(error instanceof LockBackendError && error.timedOut, String(error));
      // At commandTimeout: not tried again key by key.
      assertWithin(performance.now() - started, 300, stalls, 'the failed one-step attempt');
      stalls.stop();
      // The grant lands in Redis (both keys, a 30 s TTL), then its undo, a round trip later.
      assert.ok(
        await eventually(async () => (await stored(a)) !== null, 2_000),
        'the one-step attempt never reached Redis',
      );
      assert.ok(
        await eventually(
          async () => (await stored(a)) === null && (await stored(b)) === null,
          3_000,
        ),
        `a late grant kept: ${a} ${await stored(a)}, ${b} ${await stored(b)}`,
      );
    } finally {
      proxy.setLatency(0);
      await slow.close();
      await proxy.close();
    }
  });

  it('shutdown with a one-step attempt in flight leaves no key: its late grant is undone before the connection closes (found by mutation testing)', async () => {
    const proxy = await FaultProxy.start(() => env.server.port);
    const slow = await startLockModule({
      connection: `redis://127.0.0.1:${proxy.port}`,
      commandTimeout: 2_000,
    });
    try {
      await slow.locks.isLocked(uniqueKey()); // a connection, before the latency
      proxy.setLatency(150);
      const [a, b] = pair();
      const pending = slow.locks.acquire([a, b], { ttl: 20_000 });
      pending.catch(() => {}); // asserted below
      await sleep(20);
      await slow.close();
      await assert.rejects(pending, { name: 'RedisLockShutdownError' });
      assert.deepEqual([await stored(a), await stored(b)], [null, null], 'a late grant stayed');
    } finally {
      proxy.setLatency(0);
      await slow.close();
      await proxy.close();
    }
  });

  it("a key of several granted too late is asked for again with the call's one token: Redis holds the lock's token on every key (found by mutation testing)", async () => {
    const proxy = await FaultProxy.start(() => env.server.port);
    const slow = await startLockModule({
      connection: `redis://127.0.0.1:${proxy.port}`,
      commandTimeout: 3_000,
      defaults: { retryInterval: 100, retryJitter: 0 },
    });
    const [a, b] = pair();
    // The first key in lock order, so that no key taken before it lapses meanwhile.
    const holder = await env.other.locks.acquire(a, { ttl: 30_000 });
    try {
      await slow.locks.isLocked(uniqueKey()); // a connection, before the faults
      const pending = slow.locks.acquire([a, b], { ttl: 1_500, acquireTimeout: 10_000 });
      pending.catch(() => {}); // (ends with the app if an assertion fails)
      assert.ok(await eventually(() => waitingCallers(slow.locks, a) === 1), 'never waited for a');
      await sleep(150); // subscribed and polling
      // The release's message is held with the replies; the next poll of a is granted, and its
      // answer comes after its 1.5 s lease: undone, then asked for again.
      proxy.holdReplies();
      await holder.release();
      await sleep(1_700);
      proxy.heal();
      const lock = await pending;
      assert.deepEqual(
        [await stored(a), await stored(b)],
        [lock.token, lock.token],
        "a key held with another token than the lock's",
      );
      assert.equal(await lock.release(), true);
      assert.deepEqual([await stored(a), await stored(b)], [null, null], 'a key kept');
    } finally {
      await holder.release();
      await slow.close();
      await proxy.close();
    }
  });

  it('a several-key call nested in a section that holds one of its keys sends no one-step attempt: it re-enters that key and takes the others (found by mutation testing)', async () => {
    const [a, b] = pair();
    const monitor = await monitorRedis(env.server.port);
    try {
      await env.locks.using(a, async (outer) => {
        const lock = await env.locks.acquire([a, b]);
        assert.equal(lock.fences[a], outer.fence, 'a not re-entered');
        assert.equal(await lock.release(), true);
      });
      await monitor.caughtUp();
      for (const key of [a, b]) {
        assert.equal(scriptCalls(monitor.commands, ACQUIRE_ALL_SCRIPT, `lock:{${key}}`), 0, key);
      }
    } finally {
      monitor.stop();
    }
  });

  it('a several-key call that finds a key busy reports one event naming it: timeout for tryAcquire, skipped for a job that skips when busy (found by mutation testing)', async () => {
    const [a, b] = pair();
    const holder = await env.other.locks.acquire(b, { ttl: 10_000 });
    const seen: LockEvent[] = [];
    const subscription = env.locks.events.subscribe((event) => seen.push(event));
    try {
      assert.equal(await env.locks.tryAcquire([a, b]), null);
      // As `@WithLock({ onBusy: 'skip' })` asks.
      const skipping = { acquireTimeout: 0, [SKIP_WHEN_BUSY]: true } as AcquireOptions;
      await assert.rejects(env.locks.acquire([a, b], skipping), LockAcquireTimeoutError);
      assert.deepEqual(
        seen
          .filter((event) => event.type === 'timeout' || event.type === 'skipped')
          .map((event) => `${event.type} ${event.key}`),
        [`timeout ${b}`, `skipped ${b}`],
      );
      assert.equal(await env.locks.isLocked(a), false);
    } finally {
      subscription.unsubscribe();
      await holder.release();
    }
  });

  for (const limit of ['perKey', 'perProcess'] as const) {
    it(`a several-key call refused a key by maxWaiters (${limit}) fails at once, as a call for that key alone does, with one timeout event (found by mutation testing)`, async () => {
      const full = await startLockModule({
        connection: env.server.url,
        maxWaiters: { [limit]: 1 },
      });
      const [a, b] = pair();
      // The one caller that may wait: for b, or (perProcess) for another key.
      const other = limit === 'perKey' ? b : uniqueKey('acct');
      const holder = await env.other.locks.acquire(b, { ttl: 10_000 });
      const held = other === b ? holder : await env.other.locks.acquire(other, { ttl: 10_000 });
      const waiting = full.locks.acquire(other, { acquireTimeout: 10_000 });
      waiting.catch(() => {}); // ends with the app
      const seen: LockEvent[] = [];
      const subscription = full.locks.events.subscribe((event) => seen.push(event));
      try {
        assert.ok(await eventually(() => waitingCallers(full.locks, other) === 1), 'never queued');
        const stalls = watchStalls();
        const started = performance.now();
        const error = await full.locks
          .acquire([a, b], { acquireTimeout: 5_000 })
          .catch((e: unknown) => e);
        assert.ok(error instanceof LockAcquireTimeoutError, String(error));
        assert.equal(error.queueFull?.limit, limit);
        assert.equal(error.key, b);
        // A few round trips (its first key taken, the second refused): not its acquireTimeout.
        assertWithin(performance.now() - started, 500, stalls, 'refused by maxWaiters');
        stalls.stop();
        assert.equal(await env.locks.isLocked(a), false, 'the first key was given back');
        // The call's own event; its part for b reports none of its own.
        assert.deepEqual(
          seen.filter((event) => event.type === 'timeout').map((event) => event.key),
          [b],
        );
      } finally {
        subscription.unsubscribe();
        await holder.release();
        if (held !== holder) await held.release();
        await waiting.then((lock) => lock.release()).catch(() => {});
        await full.close();
      }
    });
  }

  it('an abort while waiting for the next key rejects with LockAcquireAbortedError and gives back the keys taken (found by mutation testing)', async () => {
    const [a, b] = pair();
    const holder = await env.other.locks.acquire(b, { ttl: 10_000 });
    try {
      const controller = new AbortController();
      const pending = env.locks.acquire([a, b], {
        acquireTimeout: 10_000,
        signal: controller.signal,
      });
      assert.ok(await eventually(async () => (await stored(a)) !== null), 'a never taken');
      const stalls = watchStalls();
      const abortedAt = performance.now();
      controller.abort(new Error('the client went away'));
      await assert.rejects(pending, LockAcquireAbortedError);
      // The first key given back, one round trip: not the 10 s deadline.
      assertWithin(performance.now() - abortedAt, 500, stalls, 'the aborted call');
      stalls.stop();
      assert.equal(await stored(a), null, 'the first key was not given back');
    } finally {
      await holder.release();
    }
  });

  it('a Redis failure while waiting for the next key rejects at once, not after giving back the keys taken, which cannot be reached either (found by mutation testing)', async () => {
    const proxy = await FaultProxy.start(() => env.server.port);
    const commandTimeout = 600;
    const retryInterval = 100;
    const slow = await startLockModule({
      connection: `redis://127.0.0.1:${proxy.port}`,
      commandTimeout,
      defaults: { retryInterval, retryJitter: 0 },
    });
    const [a, b] = pair();
    const holder = await env.other.locks.acquire(b, { ttl: 10_000 });
    const monitor = await monitorRedis(env.server.port);
    try {
      const pending = slow.locks.acquire([a, b], { ttl: 5_000, acquireTimeout: 10_000 });
      pending.catch(() => {}); // asserted below
      // Asleep on b: its attempt, and its attempt once subscribed (not still subscribing, which
      // a stall would hold up for commandTimeout before the attempt's own).
      assert.ok(
        await eventually(() => scriptCalls(monitor.commands, ACQUIRE_SCRIPT, `lock:{${b}}`) >= 2),
        'never waited for b',
      );
      monitor.stop();
      const stalls = watchStalls();
      const stalledAt = performance.now();
      proxy.stall(); // its next attempt at b gets no answer; nor would a release of a
      await assert.rejects(pending, LockBackendError);
      assertWithin(
        performance.now() - stalledAt,
        retryInterval + commandTimeout,
        stalls,
        'the failed call',
      );
      stalls.stop();
    } finally {
      monitor.stop();
      proxy.heal();
      await holder.release();
      await slow.close();
      await proxy.close();
      await env.redis.del(`lock:{${a}}`); // its release did not get through: a 5 s TTL
    }
  });

  it('without auto-extension, the wait for the next key gives the keys held back by commandTimeout before the first of their leases ends (found by mutation testing)', async () => {
    const commandTimeout = 1_000;
    const own = await startLockModule({ connection: env.server.url, commandTimeout });
    const [a, b, c] = [uniqueKey('acct'), uniqueKey('acct'), uniqueKey('acct')].sort();
    // b is free 600 ms after a was taken, c not before the call gives up.
    const holders = await Promise.all([b, c].map((key) => env.other.locks.acquire(key)));
    try {
      const ttl = 3_000;
      const started = performance.now(); // before a's attempt: its lease starts after this
      const stalls = watchStalls();
      const pending = own.locks.acquire([a, b, c], {
        ttl,
        acquireTimeout: 2_800,
        autoExtend: false,
      });
      pending.catch(() => {}); // asserted below
      assert.ok(await eventually(async () => (await stored(a)) !== null), 'a never taken');
      setTimeout(() => void holders[0].release(), 600);
      // Given back at a's lease's end less commandTimeout (2 s): not at half of what was left
      // (1.5 s), nor at b's lease's end less commandTimeout (2.6 s), nor kept until its TTL ran
      // out in Redis (3 s).
      assert.ok(await eventually(async () => (await stored(a)) === null, 5_000));
      const gone = performance.now() - started;
      assert.ok(gone >= ttl - commandTimeout - 150, `given back after ${gone.toFixed(0)} ms`);
      assertWithin(gone, ttl - commandTimeout, stalls, 'the give-back of a');
      stalls.stop();
      await assert.rejects(pending, LockAcquireTimeoutError);
    } finally {
      await holders[0].release();
      await holders[1].release();
      await own.close();
    }
  });

  it('a call whose last round found a lease run out says so: its LockAcquireTimeoutError names that key, not busy (found by mutation testing)', async () => {
    const proxy = await FaultProxy.start(() => env.server.port);
    const slow = await startLockModule({
      connection: `redis://127.0.0.1:${proxy.port}`,
      commandTimeout: 3_000,
      defaults: { retryInterval: 50, retryJitter: 0 },
    });
    try {
      for (let attempt = 1; ; attempt++) {
        const [a, b] = pair();
        const busy = await env.other.locks.acquire(b, { ttl: 10_000 });
        const taking = slow.locks
          .acquire([a, b], { ttl: 1_000, acquireTimeout: 1_000, autoExtend: false })
          .catch((error: unknown) => error);
        assert.ok(await eventually(async () => (await stored(a)) !== null), 'a never taken');
        const takenBy = performance.now();
        assert.ok(await eventually(() => waitingCallers(slow.locks, b) === 1), 'no wait for b');
        // b is granted at the waiter's next retry after 400 ms (its wait ends at ~500, half a's
        // lease), but the answer is held until a's lease (~1,000 ms) and the call's
        // acquireTimeout are over, and b's own (~1,450) is not.
        await sleep(Math.max(0, takenBy + 400 - performance.now()));
        proxy.holdReplies();
        await busy.release();
        // (A retry Redis ran just before the release, its answer held, has the waiter wait for
        // that answer instead of retrying: try again.)
        const retried = await eventually(async () => (await stored(b)) !== null, 400);
        await sleep(Math.max(0, takenBy + 1_150 - performance.now()));
        proxy.heal();
        const error = await taking;
        if (!(error instanceof Error)) await (error as Lock).release();
        // Only a lapse of a can name a (nobody else holds it). A machine too slow for the
        // timings above ends the call otherwise (b's own lease also over, or the round cut
        // short before b was freed): try again.
        if (!retried || !(error instanceof LockAcquireTimeoutError) || error.key !== a) {
          assert.ok(attempt < 3, `the scenario never happened: ${String(error)}`);
          continue;
        }
        assert.equal(error.busy, false, 'a lease that ran out reported as a busy key');
        assert.ok(
          await eventually(async () => (await stored(a)) === null && (await stored(b)) === null),
          'a key of the failed call kept',
        );
        break;
      }
    } finally {
      proxy.heal();
      await slow.close();
      await proxy.close();
    }
  });

  it('free keys granted in one step as shutdown begins are given back, and the call rejects with RedisLockShutdownError', async () => {
    const own = await startLockModule({ connection: env.server.url });
    const [a, b] = pair();
    let closing: Promise<void> | undefined;
    // Shutdown begins as the grant is reported (its events come before the lock is returned):
    // its sweep finds the new locks and ends them, and the call gives them back.
    const subscription = own.locks.events.subscribe((event) => {
      if (event.type === 'acquired' && event.key === a)
        closing ??= own.locks.onApplicationShutdown();
    });
    try {
      await assert.rejects(own.locks.acquire([a, b]), { name: 'RedisLockShutdownError' });
      await closing;
      assert.deepEqual([await stored(a), await stored(b)], [null, null], 'a key kept');
    } finally {
      subscription.unsubscribe();
      await closing;
      await own.close();
    }
  });

  it('a round after one that stopped at a busy key waits for that key first, holding nothing, then asks each key before it once: it never waits for another key while it holds the busy one (found by mutation testing)', async () => {
    const [a, b] = pair();
    const monitor = await monitorRedis(env.server.port);
    const holdsB = await env.other.locks.acquire(b, { ttl: 10_000 });
    let holdsA: Lock | undefined;
    try {
      await monitor.caughtUp();
      const from = monitor.commands.length;
      const seen = (): MonitoredCommand[] => monitor.commands.slice(from);
      /** Where in `seen()` the first call of `script` on `key` after `after` is (-1: none). */
      const first = (script: string, key: string, after = -1, not?: string): number => {
        const all = seen();
        const calls = scriptCallsOf(all, script, `lock:{${key}}`).filter(
          ({ args }) => not === undefined || !args.includes(not),
        );
        return calls.map((call) => all.indexOf(call)).find((i) => i > after) ?? -1;
      };
      // A short lease, not extended: the first round, holding a, waits for b only until a's
      // lease is near its end, gives a back and stops at b.
      const taking = env.locks.acquire([a, b], {
        ttl: 600,
        autoExtend: false,
        acquireTimeout: 10_000,
      });
      taking.catch(() => {}); // awaited below
      let gaveBack = -1;
      assert.ok(
        await eventually(() => (gaveBack = first(RELEASE_SCRIPT, a)) >= 0),
        'the first round never gave a back',
      );
      assert.ok(
        await eventually(
          () =>
            Math.max(first(ACQUIRE_SCRIPT, a, gaveBack), first(ACQUIRE_SCRIPT, b, gaveBack)) >= 0,
        ),
        'no second round',
      );
      // Its wait for b was one (its place in b's queue), not a single attempt: with 600 ms
      // left of a's lease, it ends half of that before the lease does, not commandTimeout (1 s)
      // before it, which is past.
      const queuedForB = seen().findIndex(
        ({ args }) => args[0] === 'zadd' && args[1] === `lock:{${b}}:turns`,
      );
      assert.ok(queuedForB >= 0 && queuedForB < gaveBack, 'the first round never waited for b');
      const [nextA, nextB] = [
        first(ACQUIRE_SCRIPT, a, gaveBack),
        first(ACQUIRE_SCRIPT, b, gaveBack),
      ];
      assert.ok(
        nextB >= 0 && (nextA < 0 || nextB < nextA),
        'the next round took the free key first, to hold it while it waited',
      );
      // The key before the busy one taken meanwhile: the call, granted the busy one, asks for it
      // once, gives the busy one back, and only then waits for it (its place in a's queue).
      holdsA = await env.other.locks.acquire(a, { ttl: 10_000 });
      await monitor.caughtUp();
      const freed = seen().length - 1;
      await holdsB.release();
      const turnsOfA = (): number =>
        seen().findIndex(
          ({ args }, i) => i > freed && args[0] === 'zadd' && args[1] === `lock:{${a}}:turns`,
        );
      assert.ok(await eventually(() => turnsOfA() >= 0), 'never waited for a');
      const gaveB = first(RELEASE_SCRIPT, b, freed, holdsB.token);
      assert.ok(gaveB >= 0 && gaveB < turnsOfA(), 'held b while it waited for a');
      await holdsA.release();
      const lock = await taking;
      assert.deepEqual(lock.keys, [a, b]);
      await lock.release();
    } finally {
      monitor.stop();
      await holdsB.release();
      await holdsA?.release();
    }
  });

  it('free keys whose one-step grant was taken just before shutdown began, and made into locks after its sweep, are given back: the call rejects with RedisLockShutdownError (found by mutation testing)', async () => {
    const own = await startLockModule({ connection: env.server.url });
    const [a, b] = pair();
    let closing: Promise<void> | undefined;
    const backend = (
      own.locks as unknown as {
        engine: { backend: { tryAcquireAll(...args: unknown[]): Promise<unknown> | undefined } };
      }
    ).engine.backend;
    const tryAcquireAll = backend.tryAcquireAll.bind(backend);
    backend.tryAcquireAll = (...args) => {
      const pending = tryAcquireAll(...args);
      // Heard after the engine's own handler of the reply (registered as the call was sent):
      // shutdown begins, and sweeps, between the reply taken and the call's locks made.
      queueMicrotask(
        () => void pending?.then(() => (closing ??= own.locks.onApplicationShutdown())),
      );
      return pending;
    };
    try {
      // Deleted, whatever holdAtLeast asked: no work ran under them.
      await assert.rejects(own.locks.acquire([a, b], { holdAtLeast: 5_000 }), {
        name: 'RedisLockShutdownError',
      });
      assert.ok(closing, 'shutdown never began');
      await closing;
      assert.deepEqual([await stored(a), await stored(b)], [null, null], 'a key kept');
    } finally {
      await closing;
      await own.close();
    }
  });

  it('never grants several keys with a lapsed lease: through a 150 ms/way link, a key taken before the busy one ran out', async () => {
    const proxy = await FaultProxy.start(() => env.server.port);
    const slow = await startLockModule({ connection: `redis://127.0.0.1:${proxy.port}` });
    const monitor = await monitorRedis(env.server.port);
    try {
      await slow.locks.isLocked(uniqueKey()); // a connection, before the latency
      proxy.setLatency(150);
      /** Keys taken whose lease had run out before the rest were: released, not granted. */
      let undone = 0;
      for (let round = 0; round < 3; round++) {
        const [a, b] = pair();
        // b is busy when the one-step attempt reaches Redis (at 150 ms): the keys are then taken
        // one by one, a (sent at ~300 ms, its 400 ms lease over at ~690) then b, free by then
        // (released once the one-step attempt ran) but granted only at ~900 ms: a's lease ran
        // out meanwhile. (Freed before the one-step attempt arrived, both keys would be taken in
        // one step and this would test nothing: so it did until the undo count was asserted.)
        const busy = await env.other.locks.acquire(b, { ttl: 5_000 });
        await monitor.caughtUp();
        const from = monitor.commands.length;
        const taking = slow.locks
          .acquire([a, b], { ttl: 400, acquireTimeout: 1_200 })
          .catch((error: unknown) => error);
        // Freed once Redis ran the one-step attempt (and found b busy), not at a time guessed.
        assert.ok(
          await eventually(
            () => scriptCalls(monitor.commands.slice(from), ACQUIRE_ALL_SCRIPT, `lock:{${a}}`) > 0,
          ),
          'the one-step attempt never reached Redis',
        );
        await busy.release();
        const lock = await taking;
        await monitor.caughtUp();
        const releases = (key: string): number =>
          scriptCalls(monitor.commands.slice(from), RELEASE_SCRIPT, `lock:{${key}}`);
        // Every release meanwhile but the busy holder's own is an undo of the slow app's.
        undone += releases(a) + releases(b) - 1;
        if (lock instanceof Error) {
          assert.ok(lock instanceof LockAcquireTimeoutError, String(lock));
          continue;
        }
        const left = (lock as Lock).expiresAt - performance.now();
        assert.ok(left > 0, `round ${round}: [a, b] granted with a lease of ${left.toFixed(0)} ms`);
        await (lock as Lock).release();
      }
      // The scenario happened: a test whose leases never ran out would prove nothing.
      assert.ok(undone > 0, 'no key was taken after its lease ran out in any round');
    } finally {
      monitor.stop();
      proxy.setLatency(0);
      await slow.close();
      await proxy.close();
    }
  });

  it('using(): auto-extends every key, exposes the lock and each key’s own through getCurrentLock, and nests without deadlock', async () => {
    const [a, b] = pair();
    const result = await env.locks.using(
      [b, a],
      async (lock) => {
        assert.equal(getCurrentLock(), lock);
        assert.equal(getCurrentLock(b)?.fence, lock.fences[b]);
        assert.equal(getCurrentLock(b)?.key, b);
        await sleep(500); // past the TTL: the watchdog keeps both
        assert.equal(lock.signal.aborted, false);
        assert.equal(await stored(a), lock.token);
        assert.equal(await stored(b), lock.token);
        // Re-entry: one key, and both, in the same call chain.
        const inner = await env.locks.using(b, (nested) => nested.fence, { acquireTimeout: 0 });
        assert.equal(inner, lock.fences[b]);
        await env.locks.using([a, b], () => undefined, { acquireTimeout: 0 });
        assert.equal(await stored(b), lock.token, 're-entry does not release');
        return 'done';
      },
      { ttl: 300 },
    );
    assert.equal(result, 'done');
    assert.equal(await env.locks.isLocked(a), false);
    assert.equal(await env.locks.isLocked(b), false);
  });

  it('aborts the signal when any key is lost; extend() throws, release() frees the rest and says false', async () => {
    const [a, b] = pair();
    const lock = await env.locks.acquire([a, b], { ttl: 10_000 });
    const signal = lock.signal;
    await env.redis.del(`lock:{${b}}`); // lost, as an eviction or a failover would lose it
    const error = await lock.extend().catch((e: unknown) => e);
    assert.ok(error instanceof LockLostError, String(error));
    assert.equal(signal.aborted, true);
    assert.ok(signal.reason instanceof LockLostError);
    assert.equal(signal.reason.key, b);
    assert.equal(await lock.release(), false);
    assert.equal(await env.locks.isLocked(a), false);
  });

  it('a key lost stops the other keys’ watchdogs: each lapses at its TTL, never released', async () => {
    const [a, b] = pair();
    const ttl = 600;
    const lock = await env.locks.acquire([a, b], { ttl, autoExtend: true });
    const signal = lock.signal;
    await env.redis.del(`lock:{${a}}`); // lost, as an eviction or a failover would lose it
    // The watchdog's next extension of `a` (every ttl / 3) finds it gone.
    assert.ok(await eventually(() => signal.aborted, 2 * ttl), 'the loss of a was never noticed');
    // `b`, held by nobody any more, is extended no more: gone within its TTL, with no release.
    await lapsesWithin(b, ttl, 'b lapsing after the loss');
    // And extend() of the lost lock extends nothing.
    const other = await env.locks.acquire(b, { ttl: 10_000 });
    await assert.rejects(lock.extend(5_000), LockLostError);
    assert.ok((await env.redis.pttl(`lock:{${b}}`)) <= 10_000);
    assert.equal(await lock.release(), false);
    assert.equal(await stored(b), other.token, 'the release of the lost lock left the new holder');
    await other.release();
  });

  for (const how of ['lost', 'released'] as const) {
    it(`a re-entered key whose outer hold is ${how} stops the watchdogs of the keys the lock took`, async () => {
      const [a, b] = pair();
      const ttl = 300;
      let inner: Lock | undefined;
      await env.locks.using(
        a,
        async () => {
          // Nested: re-enters a, takes b itself; never released.
          inner = await env.locks.acquire([a, b], { ttl, autoExtend: true });
          if (how === 'lost') {
            const signal = inner.signal;
            await env.redis.del(`lock:{${a}}`); // the outer hold's watchdog finds it gone
            assert.ok(await eventually(() => signal.aborted, 2 * ttl), 'a’s loss never noticed');
          }
        },
        { ttl, autoExtend: true },
      );
      // The outer section is over (a released, or lost): the inner lock is lost with it.
      assert.equal(inner!.signal.aborted, true);
      await lapsesWithin(b, ttl, 'b lapsing after the outer end');
      assert.equal(await inner!.release(), false);
    });
  }

  it('extend() of a lock whose re-entered key ran out unobserved extends none of its keys', async () => {
    const [a, b] = pair();
    await env.locks.using(
      a,
      async () => {
        // Re-enters a (its 1 s lease, at once: a loaded machine cannot make it lapse first), takes
        // b with the default TTL (30 s).
        const inner = await env.locks.acquire([a, b]);
        await sleep(1_100); // a's lease over, unobserved; b's not
        const before = await env.redis.pttl(`lock:{${b}}`);
        assert.equal(await env.redis.exists(`lock:{${a}}`), 0, 'a ran out');
        await assert.rejects(inner.extend(600_000), LockLostError);
        assert.ok((await env.redis.pttl(`lock:{${b}}`)) <= before, 'b was extended');
        assert.equal(await inner.release(), false);
      },
      { ttl: 1_000, autoExtend: false },
    );
  });

  it('wakes a waiter on one of the keys when the set is released', async () => {
    const [a, b] = pair();
    const waiter = await startNonPollingApp({ connection: env.server.url });
    try {
      const lock = await env.locks.acquire([a, b], { ttl: 30_000 });
      const waiting = waiter.locks.acquire(b, { acquireTimeout: 5_000 });
      await sleep(100);
      await lock.release();
      const next = await waiting; // the release woke it: no poll within its 5 s
      assert.ok(next.fence > lock.fences[b]);
      await next.release();
    } finally {
      await waiter.close();
    }
  });

  it('LockService.release() and extend() take it; another app’s service refuses it', async () => {
    const [a, b] = pair();
    const lock = await env.locks.acquire([a, b]);
    await assert.rejects(env.other.locks.release(lock), LockArgumentError);
    await env.locks.extend(lock, 6_000);
    assert.ok((await env.redis.pttl(`lock:{${a}}`)) > 5_000);
    assert.equal(await env.locks.release(lock), true);
  });

  it('reports events per key', async () => {
    const [a, b] = pair();
    const seen: LockEvent[] = [];
    const subscription = env.locks.events.subscribe((event) => seen.push(event));
    try {
      const lock = await env.locks.acquire([a, b]);
      await lock.release();
    } finally {
      subscription.unsubscribe();
    }
    const of = (type: string): string[] =>
      seen.filter((event) => event.type === type).map((event) => event.key);
    assert.deepEqual(of('acquired'), [a, b]);
    assert.deepEqual(of('released').sort(), [a, b]);
  });

  it('combines with the other shapes, each key taking it: read locks, semaphores, fair locks', async () => {
    const [a, b] = pair();
    const readers = await Promise.all(
      [env.locks, env.other.locks].map((service) => service.acquire([a, b], { mode: 'read' })),
    );
    assert.equal(await env.locks.tryAcquire(b), null, 'a writer waits for the readers of b');
    await Promise.all(readers.map((lock) => lock.release()));
    const places = await Promise.all(
      [env.locks, env.other.locks].map((service) => service.acquire([b, a], { limit: 2 })),
    );
    assert.equal(await env.locks.tryAcquire([a, b], { limit: 2 }), null, 'both keys are full');
    await Promise.all(places.map((lock) => lock.release()));
    const fair = await env.locks.acquire([a, b], { fair: true });
    assert.equal(await env.other.locks.tryAcquire(a, { fair: true }), null);
    await fair.release();
    assert.equal(await env.locks.isLocked(a), false);
    assert.equal(await env.locks.isLocked(b), false);
  });

  it('a holder that crashed frees every key after its TTL, not before', async () => {
    const [a, b] = pair();
    const calledAt = performance.now();
    await env.other.locks.acquire([a, b], { ttl: 400 }); // never released: its process "died"
    assert.equal(await env.locks.tryAcquire([a, b]), null);
    const watch = watchStalls();
    const lock = await env.locks.acquire([b, a], { acquireTimeout: 3_000 });
    // Redis set the TTL after `calledAt`: the keys cannot be free before 400 ms from then.
    const after = performance.now() - calledAt;
    assert.ok(after >= 399, `free after ${after.toFixed(0)} ms`);
    // The waiter tries again when the holder's TTL ends (the attempt's reply says when).
    assertWithin(after, 400, watch, 'the wait for the crashed holder’s keys');
    watch.stop();
    await lock.release();
  });

  it('a one-key array is a plain lock', async () => {
    const key = uniqueKey();
    const lock: Lock = await env.locks.acquire([key]);
    assert.equal(lock.key, key);
    assert.deepEqual(lock.keys, [key]);
    assert.deepEqual(lock.fences, { [key]: lock.fence });
    await lock.release();
  });

  it('rejects an empty list, a key named twice and a bad key with LockArgumentError, taking nothing', async () => {
    const key = uniqueKey();
    for (const keys of [
      [],
      [key, key],
      [key, ''],
      [key, 7],
      [key, null],
    ] as unknown as string[][]) {
      await assert.rejects(env.locks.acquire(keys), LockArgumentError, JSON.stringify(keys));
      await assert.rejects(env.locks.tryAcquire(keys), LockArgumentError);
      await assert.rejects(
        env.locks.using(keys, () => undefined),
        LockArgumentError,
      );
    }
    assert.equal(await env.locks.isLocked(key), false);
  });
});
