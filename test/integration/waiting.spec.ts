import { createHash } from 'node:crypto';
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import { getEventListeners } from 'node:events';
import type { Socket } from 'node:net';
import { Redis } from 'ioredis';
import {
  LockAcquireAbortedError,
  LockAcquireTimeoutError,
  LockBackendError,
  LockLostError,
  type Lock,
  type LockService,
  type RedisLockModuleOptions,
} from '../../lib/index.js';
import {
  eventually,
  heldWithHeir,
  LogCapture,
  sleep,
  startLockModule,
  startNonPollingApp,
  uniqueKey,
  waitingCallers,
  type LockModuleFixture,
} from '../support/lock-module.js';
import { assertWithin, watchStalls } from '../support/timing.js';
import {
  monitorRedis,
  scriptCalls,
  scriptCallsOf,
  scriptSequence,
  type MonitoredCommand,
} from '../support/redis-monitor.js';
import { startRedis, type RedisServer } from '../support/redis-server.js';
import {
  ACQUIRE_SCRIPT,
  ACQUIRE_UNRESERVED_SCRIPT,
  DROP_MARK_SCRIPT,
  EXTEND_SCRIPT,
  FENCE_STRIDE,
  HANDOFF_SCRIPT,
  HANDOFF_UNRESERVED_SCRIPT,
  PASS_ON_SCRIPT,
  RELEASE_SCRIPT,
} from '../../lib/redis/lock.scripts.js';
import { ACQUIRE_READ_SCRIPT, ACQUIRE_SEMAPHORE_SCRIPT } from '../../lib/redis/shape.scripts.js';
import { DEFAULT_HANDOFF_TURN } from '../../lib/options/defaults.js';
import { FaultProxy } from '../support/fault-proxy.js';

describe('waiting for a held lock', () => {
  let server: RedisServer;
  let holderApp: LockModuleFixture;
  let waiterApp: LockModuleFixture;
  let holder: LockService;
  let waiter: LockService;
  let redis: Redis;

  before(async () => {
    server = await startRedis();
    // Two modules = two independent clients, as two app instances would have.
    holderApp = await startLockModule({ connection: server.url });
    waiterApp = await startLockModule({ connection: server.url });
    holder = holderApp.locks;
    waiter = waiterApp.locks;
    redis = new Redis(server.port, '127.0.0.1');
    // Loaded up front, so that no test sees a first run's NOSCRIPT and EVAL as two calls.
    for (const script of [HANDOFF_SCRIPT, HANDOFF_UNRESERVED_SCRIPT, PASS_ON_SCRIPT]) {
      await redis.script('LOAD', script);
    }
  });
  after(async () => {
    await holderApp?.close();
    await waiterApp?.close();
    redis?.disconnect();
    await server?.stop();
  });

  /**
   * After a handoff to `next`, seen by `monitor`: `script` ran once on the key and no other lock
   * script did, nothing was published, and Redis holds `next`'s token with its TTL, and the fence
   * counter with that TTL + fenceRetention.
   */
  async function assertHandedOver(
    monitor: Awaited<ReturnType<typeof monitorRedis>>,
    key: string,
    script: string,
    next: Lock,
    ttl: number,
  ): Promise<void> {
    await monitor.caughtUp();
    const calls = (s: string): number => scriptCalls(monitor.commands, s, `lock:{${key}}`);
    const scripts = [PASS_ON_SCRIPT, HANDOFF_SCRIPT, RELEASE_SCRIPT, ACQUIRE_SCRIPT];
    assert.deepEqual(
      scripts.map(calls),
      scripts.map((s) => (s === script ? 1 : 0)),
    );
    assert.ok(!monitor.commands.some(({ args }) => args[0] === 'publish'));
    assert.equal(await redis.get(`lock:{${key}}`), next.token);
    const pttl = await redis.pttl(`lock:{${key}}`);
    assert.ok(pttl > ttl - 1_000 && pttl <= ttl, `the heir's own TTL: ${pttl}`);
    // The counter is every key's: at least the heir's TTL + fenceRetention (longer where an earlier
    // lock's was longer: it never shrinks).
    const counterPttl = await redis.pttl('lock:{}:counter');
    assert.ok(
      counterPttl > ttl + 59_000,
      `the fence counter's TTL, the heir's TTL + fenceRetention: ${counterPttl}`,
    );
  }

  /**
   * A lock on a new key held through `locks`, and one caller queued and asleep behind it: its
   * attempt and its attempt once subscribed have both run, and it sends nothing more until a
   * release wakes it.
   */
  async function heldWithWaiter(
    locks: LockService,
    heldTtl: number,
    waiterTtl: number,
  ): Promise<{ key: string; held: Lock; queued: Promise<Lock> }> {
    const key = uniqueKey();
    const held = await locks.acquire(key, { ttl: heldTtl });
    const attempts = await attemptsOn(key);
    try {
      const queued = locks.acquire(key, { ttl: waiterTtl, acquireTimeout: 10_000 });
      await attempts.asleep(2);
      return { key, held, queued };
    } finally {
      attempts.stop();
    }
  }

  /**
   * Runs `fn` with an app (`options`) whose connection to the test's Redis goes through a fault
   * proxy, and a MONITOR of that Redis; closes the three after it.
   */
  async function throughProxy(
    options: Omit<RedisLockModuleOptions, 'connection'>,
    fn: (
      proxy: FaultProxy,
      app: LockModuleFixture,
      monitor: Awaited<ReturnType<typeof monitorRedis>>,
    ) => Promise<void>,
    /** The Redis behind the proxy: the test's own, or a private one a test may disturb. */
    target: RedisServer = server,
  ): Promise<void> {
    const proxy = await FaultProxy.start(() => target.port);
    const app = await startLockModule({
      ...options,
      connection: `redis://127.0.0.1:${proxy.port}`,
    });
    const monitor = await monitorRedis(target.port);
    try {
      await fn(proxy, app, monitor);
    } finally {
      monitor.stop();
      await app.close();
      await proxy.close();
    }
  }

  /** Waits until `count` callers of `locks` wait for `key` (each counted once it found it held). */
  async function queuedIn(locks: LockService, key: string, count: number): Promise<void> {
    assert.ok(
      await eventually(() => waitingCallers(locks, key) === count),
      `${waitingCallers(locks, key)} of ${count} callers queued`,
    );
  }

  /**
   * Starts `sections` (callers of the held key, in `locks`' process, started in one tick: none
   * finds another waiter of its process to queue behind) and, once all are queued and asleep
   * (each made its attempt and its attempt once subscribed), releases `held` and lets them all
   * run; returns the lock scripts Redis ran on the key from the release on (see `scriptSequence`).
   */
  async function scriptsWhileReleasing(
    locks: LockService,
    held: Lock,
    sections: () => Promise<unknown>[],
    letters: Parameters<typeof scriptSequence>[2],
    other: string,
  ): Promise<string> {
    const monitor = await monitorRedis(server.port);
    try {
      const started = sections();
      const attempts = (): number =>
        scriptCalls(monitor.commands, ACQUIRE_SCRIPT, `lock:{${held.key}}`);
      await queuedIn(locks, held.key, started.length);
      const asleep = 2 * started.length;
      assert.ok(
        await eventually(() => attempts() >= asleep),
        `${attempts()} of ${asleep} attempts`,
      );
      await monitor.caughtUp();
      const from = monitor.commands.length;
      await held.release();
      await Promise.all(started);
      await monitor.caughtUp();
      return scriptSequence(monitor.commands.slice(from), `lock:{${held.key}}`, letters, other);
    } finally {
      monitor.stop();
    }
  }

  it('hands the lock to a waiter in another process when it is released, not at a later poll', async () => {
    const key = uniqueKey();
    const app = await startNonPollingApp({ connection: server.url });
    try {
      for (let round = 0; round < 5; round++) {
        const held = await holder.acquire(key, { ttl: 30_000 });
        const waiting = app.locks.acquire(key, { acquireTimeout: 10_000 });
        // Its process joined the queue of waiting processes: it tried, found the key held, waits.
        assert.ok(await eventually(async () => (await redis.zcard(`lock:{${key}}:turns`)) === 1));
        await held.release();
        // Its next poll is 60 s away and the holder's TTL 30 s: only the release message can
        // have woken it within its 10 s.
        await (await waiting).release();
      }
    } finally {
      await app.close();
    }
  });

  it("tryAcquire() and a caller's own token never join the queue of waiting processes, and a release in their process never hands them the lock", async () => {
    const key = uniqueKey();
    const turns = `lock:{${key}}:turns`;
    const held = await waiter.acquire(key, { ttl: 30_000 });
    const monitor = await monitorRedis(server.port);
    try {
      assert.equal(await waiter.tryAcquire(key), null);
      const own = waiter.acquire(key, { token: 'mine', ttl: 5_000, acquireTimeout: 3_000 });
      // It tried, and found the key held.
      assert.ok(
        await eventually(() =>
          monitor.commands.some(({ args }) => args[0] === 'evalsha' && args.includes('mine')),
        ),
      );
      assert.equal(await redis.zcard(turns), 0, 'queued');
      await held.release();
      const lock = await own;
      assert.equal(lock.token, 'mine');
      const handed = [HANDOFF_SCRIPT, HANDOFF_UNRESERVED_SCRIPT, PASS_ON_SCRIPT].map((script) =>
        scriptCalls(monitor.commands, script, `lock:{${key}}`),
      );
      assert.deepEqual(handed, [0, 0, 0], 'the own token was handed the lock');
      assert.equal(await lock.release(), true);
    } finally {
      monitor.stop();
    }
  });

  it('tryAcquire() asks Redis even while callers of its process wait for the key: a key freed without a word is its at once (found by mutation testing)', async () => {
    const { key, held, queued } = await heldWithWaiter(waiter, 30_000, 30_000);
    await redis.del(`lock:{${key}}`); // freed behind the holder's back: nobody is told
    const lock = await waiter.tryAcquire(key);
    assert.ok(lock, 'tryAcquire() queued behind the waiter instead of asking');
    assert.equal(await redis.get(`lock:{${key}}`), lock.token);
    assert.equal(await held.release(), false);
    await lock.release();
    await (await queued).release();
  });

  it('an idle waiter sends a bounded number of commands while it waits', async () => {
    const key = uniqueKey();
    const held = await holder.acquire(key, { ttl: 20_000 });
    const monitor = await monitorRedis(server.port);
    const waitMs = 2_500;
    await assert.rejects(waiter.acquire(key, { acquireTimeout: waitMs }), LockAcquireTimeoutError);
    await monitor.caughtUp();
    monitor.stop();
    await held.release();
    const attempts = scriptCalls(monitor.commands, ACQUIRE_SCRIPT, `lock:{${key}}`);
    const trace = monitor.commands.map(({ args }) => args.slice(0, 4).join(' ')).join('\n');
    // One attempt, one after subscribing, then at most one per retryInterval (1 s).
    assert.ok(attempts >= 2, `attempts seen: ${attempts}`);
    assert.ok(
      attempts <= 2 + Math.ceil(waitMs / 1_000),
      `an idle waiter sent ${attempts} attempts in ${waitMs} ms:\n${trace}`,
    );
    assert.ok(
      monitor.commands.some(
        ({ args }) => args[0] === 'subscribe' && args[1] === `lock:{${key}}:released`,
      ),
      trace,
    );
  });

  it('waits no longer than the holder TTL when the holder dies without releasing', async () => {
    const key = uniqueKey();
    const watch = watchStalls();
    const calledAt = performance.now();
    await holder.acquire(key, { ttl: 400 }); // never released: the "crashed" holder
    const lock = await waiter.acquire(key, { acquireTimeout: 5_000 });
    // Redis set the TTL after `calledAt`; the waiter tries again when the TTL ends (its
    // attempt's reply says when), not at acquireTimeout.
    const waited = performance.now() - calledAt;
    assert.ok(waited >= 399, `waited ${waited.toFixed(0)} ms`);
    assertWithin(waited, 400, watch, 'the wait for the crashed holder’s key');
    watch.stop();
    await lock.release();
  });

  it('wakes one waiter per release, in turn, until all are served', async () => {
    const key = uniqueKey();
    const held = await holder.acquire(key, { ttl: 30_000 });
    const order: number[] = [];
    // Waiters that never poll within their 5 s: each gets in only if a release wakes it.
    const app = await startNonPollingApp({ connection: server.url });
    try {
      const waiters = Array.from({ length: 5 }, (_, i) =>
        app.locks.using(
          key,
          async () => {
            order.push(i);
            await sleep(5);
          },
          { acquireTimeout: 5_000 },
        ),
      );
      await queuedIn(app.locks, key, 5);
      await held.release();
      await Promise.all(waiters);
      assert.deepEqual(order, [0, 1, 2, 3, 4]);
    } finally {
      await app.close();
    }
  });

  it('contention costs one attempt per release per process, not one per waiter', async () => {
    const key = uniqueKey();
    const held = await holder.acquire(key, { ttl: 30_000 });
    const monitor = await monitorRedis(server.port);
    const attempts = (): number => scriptCalls(monitor.commands, ACQUIRE_SCRIPT, `lock:{${key}}`);
    try {
      const waiters = Array.from({ length: 5 }, () =>
        waiter.using(key, () => sleep(5), { acquireTimeout: 10_000, autoExtend: false }),
      );
      // Started in one tick, none found another waiter of its process to queue behind: each made
      // one attempt, and one more once subscribed.
      await queuedIn(waiter, key, 5);
      assert.ok(await eventually(() => attempts() >= 10), `${attempts()} of 10 attempts`);
      await monitor.caughtUp();
      const beforeRelease = attempts();
      await held.release();
      await Promise.all(waiters);
      await monitor.caughtUp();
      // Woken one at a time: five releases, five attempts. Waking every waiter on each release
      // would cost 5 + 4 + 3 + 2 + 1 = 15.
      assert.equal(beforeRelease, 10);
      assert.ok(
        attempts() - beforeRelease <= 6,
        `${attempts() - beforeRelease} attempts for 5 handoffs`,
      );
    } finally {
      monitor.stop();
    }
  });

  /**
   * Counts the acquisition attempts Redis runs on `key` from now on; `asleep(n)` waits until it has
   * run `n` of them: a waiter whose attempt and its attempt once subscribed have both run sends no
   * more until a release wakes it.
   */
  async function attemptsOn(key: string): Promise<{
    count(): number;
    asleep(attempts: number): Promise<void>;
    caughtUp(): Promise<void>;
    stop(): void;
  }> {
    const monitor = await monitorRedis(server.port);
    const count = (): number => scriptCalls(monitor.commands, ACQUIRE_SCRIPT, `lock:{${key}}`);
    return {
      count,
      async asleep(attempts) {
        assert.ok(
          await eventually(() => count() >= attempts),
          `${count()} of ${attempts} attempts`,
        );
      },
      caughtUp: () => monitor.caughtUp(),
      stop: () => monitor.stop(),
    };
  }

  it('processes take their turns in the order they began to wait: a release names the one that waited longest, and only it tries', async () => {
    const key = uniqueKey();
    const turns = `lock:{${key}}:turns`;
    const held = await holder.acquire(key, { ttl: 30_000 });
    // Apps whose waiters never poll within a test: only a release that names them wakes them.
    const apps = await Promise.all(
      ['a', 'b', 'c'].map(() => startNonPollingApp({ connection: server.url })),
    );
    const attempts = await attemptsOn(key);
    const order: string[] = [];
    try {
      const waiting: Promise<void>[] = [];
      for (const [name, app] of [
        ['c', apps[2]],
        ['a', apps[0]],
        ['b', apps[1]],
      ] as const) {
        waiting.push(
          app.locks.using(
            key,
            async () => {
              order.push(name);
              await sleep(5);
            },
            { acquireTimeout: 5_000 },
          ),
        );
        // Queued (its attempt failed, and once more once subscribed) before the next one asks.
        await attempts.asleep(2 * waiting.length);
      }
      assert.equal(await redis.zcard(turns), 3, 'three processes queued');
      // For as long as a waiter's place lasts: 2 × (retryInterval + jitter + commandTimeout).
      const pttl = await redis.pttl(turns);
      assert.ok(pttl > 0 && pttl <= 2 * (60_000 + 50 + 1_000), `the queue lapses: ${pttl}`);
      await held.release();
      await Promise.all(waiting);
      await attempts.caughtUp();
      // One attempt per release, by the process it named. Waking every process at each release
      // would cost 3 + 2 + 1.
      assert.equal(attempts.count(), 6 + 3);
      assert.deepEqual(order, ['c', 'a', 'b']);
      assert.equal(await redis.exists(turns), 0, 'the queue is gone with its last waiter');
    } finally {
      attempts.stop();
      await Promise.all(apps.map((app) => app.close()));
    }
  });

  it('with nobody queued (the queue lapsed), a release wakes the first waiter of every process, and only it', async () => {
    const key = uniqueKey();
    const held = await holder.acquire(key, { ttl: 30_000 });
    // Apps whose waiters never poll within a test: only a release wakes them.
    const apps = await Promise.all(
      [0, 1].map(() => startNonPollingApp({ connection: server.url })),
    );
    const monitor = await monitorRedis(server.port);
    const attempts = (from = 0): MonitoredCommand[] =>
      scriptCallsOf(monitor.commands.slice(from), ACQUIRE_SCRIPT, `lock:{${key}}`);
    try {
      // Two callers in each process, started in one tick: each tried, and once more once
      // subscribed.
      const waiting = apps.flatMap((app) =>
        [0, 1].map(() => app.locks.acquire(key, { acquireTimeout: 10_000 })),
      );
      for (const app of apps) await queuedIn(app.locks, key, 2);
      assert.ok(await eventually(() => attempts().length >= 8), `${attempts().length} attempts`);
      await redis.del(`lock:{${key}}:turns`); // the queue of waiting processes lapsed
      await monitor.caughtUp();
      const from = monitor.commands.length;
      await held.release();
      // One of the two first waiters gets the key; the other tried and waits on.
      const first = await Promise.race(waiting);
      // The other process's attempt may reach Redis after the winner's reply: wait for it, then
      // for MONITOR to have shown everything up to now (a third attempt would be counted).
      assert.ok(await eventually(() => attempts(from).length >= 2), 'one process was not woken');
      await monitor.caughtUp();
      const woken = attempts(from);
      assert.equal(woken.length, 2, woken.map(({ source }) => source).join(', '));
      assert.equal(new Set(woken.map(({ source }) => source)).size, 2, 'one per process');
      // Then each release wakes the next, until all four had it.
      await first.release();
      await Promise.all(waiting.map((lock) => lock.then((taken) => taken.release())));
    } finally {
      monitor.stop();
      await Promise.all(apps.map((app) => app.close()));
    }
  });

  it('a process whose callers all gave up leaves the queue; one named that does not take its turn costs the releaser a short hold-back', async () => {
    const key = uniqueKey();
    const turns = `lock:{${key}}:turns`;
    // The first app ends its turn at every release (handoffTurn 0): it names the next process.
    const apps = await Promise.all(
      [0, 1].map((handoffTurn) => startNonPollingApp({ connection: server.url, handoffTurn })),
    );
    const attempts = await attemptsOn(key);
    const listener = new Redis(server.port, '127.0.0.1');
    try {
      const held = await holder.acquire(key, { ttl: 30_000 });
      const impatient = apps[1].locks.acquire(key, { acquireTimeout: 200 });
      await assert.rejects(impatient, LockAcquireTimeoutError);
      const patient = apps[0].locks.acquire(key, { acquireTimeout: 5_000 });
      await attempts.asleep(attempts.count() + 2);
      assert.equal(await redis.zcard(turns), 1, 'only the patient app is queued');
      await held.release();
      let lock = await patient;
      // Named, a process that is gone (crashed while queued): nobody else heard the release, so
      // the releaser's own waiter goes at once. One that heard it but does not take its turn (its
      // event loop stalled): the releaser's waiter holds back a while (50 ms), then takes it.
      // Either way it is not left to its next poll (a minute away) or its deadline (30 s).
      for (const listening of [false, true]) {
        if (listening) await listener.subscribe(`lock:{${key}}:released`);
        const again = apps[0].locks.acquire(key, { acquireTimeout: 30_000 });
        await attempts.asleep(attempts.count() + 2);
        await redis.zadd(turns, 0, 'gone');
        const watch = watchStalls();
        const released = performance.now();
        await lock.release();
        lock = await again;
        const waited = performance.now() - released;
        const what = `${listening ? 'heard' : 'gone'}: took its turn back after ${waited} ms`;
        // Gone: at once (a release's round trip); heard: after the 50 ms hold-back.
        assertWithin(waited, listening ? 50 : 0, watch, what);
        watch.stop();
        assert.ok(!listening || waited >= 40, what);
        assert.equal(await redis.zscore(turns, 'gone'), null, 'named once, out of the queue');
      }
      await lock.release();
    } finally {
      listener.disconnect();
      attempts.stop();
      await Promise.all(apps.map((app) => app.close()));
    }
  });

  it('a process whose last waiter got the key leaves the queue of waiting processes at its release, even once that lock ran out (found by the model suite)', async () => {
    const key = uniqueKey();
    const held = await waiter.acquire(key, { ttl: 5_000 });
    const next = waiter.acquire(key, { ttl: 100, acquireTimeout: 5_000 });
    assert.ok(await eventually(async () => (await redis.exists(`lock:{${key}}:turns`)) === 1));
    await queuedIn(waiter, key, 1);
    await held.release(); // passed on to its own waiter: no release in Redis names anyone
    const lock = await next;
    // Its lease ran out.
    assert.ok(await eventually(async () => (await redis.exists(`lock:{${key}}`)) === 0));
    assert.equal(await lock.release(), false);
    assert.equal(await redis.exists(`lock:{${key}}:turns`), 0, 'the process stayed in the queue');
  });

  it("the queue of waiting processes keeps the longest stay: a process that retries more often never cuts another's place short", async () => {
    const key = uniqueKey();
    const held = await holder.acquire(key, { ttl: 30_000 });
    // A process that polls every 60 s stays ~2 min; one that polls every 100 ms, ~2.3 s.
    const slow = await startNonPollingApp({ connection: server.url });
    const quick = await startLockModule({
      connection: server.url,
      defaults: { retryInterval: 100 },
    });
    try {
      const first = slow.locks.acquire(key, { acquireTimeout: 10_000 });
      first.catch(() => {});
      assert.ok(await eventually(async () => (await redis.pttl(`lock:{${key}}:turns`)) > 60_000));
      const second = quick.locks.acquire(key, { acquireTimeout: 10_000 });
      second.catch(() => {});
      assert.ok(await eventually(async () => (await redis.zcard(`lock:{${key}}:turns`)) === 2));
      const pttl = await redis.pttl(`lock:{${key}}:turns`);
      assert.ok(pttl > 60_000, `the queue's TTL fell to ${pttl} ms`);
      await held.release();
      // Each releases once it has it, in whichever order: the release names the slow process,
      // but the quick one's 100 ms poll may take the key first (polls are not named; a release
      // whose message is late on a loaded machine loses to it). Awaiting the slow one's lock
      // before releasing the quick one's would then wait out its acquireTimeout.
      await Promise.all([first, second].map(async (lock) => (await lock).release()));
    } finally {
      await slow.close();
      await quick.close();
    }
  });

  it('waiters in one process are served in order of arrival, and a releaser that asks again queues behind them', async () => {
    const key = uniqueKey();
    const held = await waiter.acquire(key, { ttl: 30_000 });
    const order: string[] = [];
    const take = (name: string): Promise<void> =>
      waiter.using(key, () => void order.push(name), { acquireTimeout: 10_000 });
    const queued: Promise<void>[] = [];
    const attempts = await attemptsOn(key);
    try {
      for (let i = 0; i < 5; i++) {
        queued.push(take(`w${i}`));
        await queuedIn(waiter, key, i + 1); // one after another
        // The first is asleep once its attempt and its attempt once subscribed have run: released
        // while one of those is still on its way, the lock goes to the next (a CI run: w1–w4, w0).
        if (i === 0) await attempts.asleep(2);
      }
    } finally {
      attempts.stop();
    }
    await held.release();
    // Asks again at once, while its release is still on its way to the first waiter: without
    // the queue it would win (its attempt needs no pub/sub round trip) and go first.
    queued.push(take('again'));
    await Promise.all(queued);
    assert.deepEqual(order, ['w0', 'w1', 'w2', 'w3', 'w4', 'again']);
  });

  it('with handoffTurn 0 (every release frees the key), a releaser that asks again at once still queues behind the waiter its release wakes (found by mutation testing)', async () => {
    const app = await startLockModule({ connection: server.url, handoffTurn: 0 });
    try {
      const key = uniqueKey();
      const order: string[] = [];
      const take = (name: string): Promise<void> =>
        app.locks.using(key, () => void order.push(name), { acquireTimeout: 10_000 });
      for (let round = 0; round < 3; round++) {
        const held = await app.locks.acquire(key, { ttl: 30_000 });
        const attempts = await attemptsOn(key);
        let first: Promise<void>;
        try {
          first = take(`w${round}`);
          await attempts.asleep(2); // its attempt, and its attempt once subscribed
        } finally {
          attempts.stop();
        }
        await held.release();
        // Its attempt would reach Redis before the woken waiter's (which hears of the release
        // through pub/sub first): without the queue it would win.
        const again = take(`again${round}`);
        await Promise.all([first, again]);
      }
      assert.deepEqual(order, ['w0', 'again0', 'w1', 'again1', 'w2', 'again2']);
    } finally {
      await app.close();
    }
  });

  it('a first waiter whose retry is on its way as the lock is released keeps its place: it is handed the lock, not the second', async () => {
    // Through a link slow enough (100 ms each way) to release while the retry's answer is coming.
    const proxy = await FaultProxy.start(() => server.port);
    const app = await startLockModule({
      connection: `redis://127.0.0.1:${proxy.port}`,
      defaults: { retryInterval: 300, retryJitter: 0 },
    });
    try {
      const key = uniqueKey();
      const held = await app.locks.acquire(key, { ttl: 30_000 });
      proxy.setLatency(100);
      const order: string[] = [];
      const take = (name: string): Promise<void> =>
        app.locks.using(key, () => void order.push(name), { acquireTimeout: 10_000 });
      const attempts = await attemptsOn(key);
      let queued: Promise<void>[];
      try {
        queued = [take('w0')];
        await attempts.asleep(2); // its attempt, and its attempt once subscribed
        queued.push(take('w1'));
        await attempts.asleep(4);
        // Only the first waiter retries (every 300 ms): the next attempt Redis sees is w0's.
        const seen = attempts.count();
        assert.ok(await eventually(() => attempts.count() > seen, 3_000), 'w0 retries');
      } finally {
        attempts.stop();
      }
      await held.release();
      await Promise.all(queued);
      assert.deepEqual(order, ['w0', 'w1']);
    } finally {
      await app.close();
      await proxy.close();
    }
  });

  it('a release with less than commandTimeout of its lease left hands nothing to a waiter whose retry is on its way: the key may lapse while the release travels and that retry take it, and the release answers false, not true', async () => {
    // A partition (the proxy stalls) holds the waiter's retry and then the release until the
    // releaser's lease has run out in Redis: the retry, delivered first, takes the lapsed key.
    // (commandTimeout 2 s: the retry and the release wait out the partition, up to ~1 s.)
    await throughProxy(
      { commandTimeout: 2_000, defaults: { retryInterval: 100, retryJitter: 0 } },
      async (proxy, app, monitor) => {
        // The scenario needs the waiter's retry sent during the partition, before the release: on a
        // machine too slow for that, it is played again.
        for (let round = 0; ; round++) {
          const key = uniqueKey();
          const held = await app.locks.acquire(key, { ttl: 900, autoExtend: false });
          const queued = app.locks.acquire(key, { ttl: 30_000, acquireTimeout: 10_000 });
          const attempts = (): MonitoredCommand[] =>
            scriptCallsOf(monitor.commands, ACQUIRE_SCRIPT, `lock:{${key}}`).filter(
              ({ args }) => !args.includes(held.token),
            );
          assert.ok(
            await eventually(() => attempts().length >= 2),
            'the waiter never went to sleep',
          );
          const seen = attempts().length;
          assert.ok(await eventually(() => attempts().length > seen, 3_000), 'no retry');
          // Its next retry (100 ms on) is sent into the partition.
          proxy.stall();
          await sleep(300);
          // Less than commandTimeout (2 s) left: no heir but a sleeping waiter.
          assert.ok(held.expiresAt - performance.now() < 2_000);
          const released = held.release();
          // Until Redis has let the releaser's key go (its TTL runs from after expiresAt).
          await sleep(held.expiresAt - performance.now() + 100);
          await monitor.caughtUp();
          const from = monitor.commands.length;
          proxy.heal();
          const answer = await released;
          const lock = await queued;
          await monitor.caughtUp();
          const order = scriptSequence(
            monitor.commands.slice(from),
            `lock:{${key}}`,
            [
              [ACQUIRE_SCRIPT, 'a'],
              [RELEASE_SCRIPT, 'r'],
              [HANDOFF_SCRIPT, 'h'],
            ],
            'x',
          );
          await lock.release();
          if (!order.startsWith('a') && round < 2) continue;
          assert.match(order, /^a[rh]/, 'the retry sent during the partition, then the release');
          // The key had lapsed and the waiter's retry took it: the release found it gone.
          assert.equal(answer, false);
          assert.equal(lock.token === held.token, false);
          break;
        }
      },
    );
  });

  it('a lock known lost hands nothing to a waiter whose retry is on its way: that retry may have taken the key, and the release answers false, not true', async () => {
    // Through a link slow enough (150 ms each way) to release while the retry's answer is coming.
    await throughProxy(
      { defaults: { retryInterval: 300, retryJitter: 0 } },
      async (proxy, app, monitor) => {
        const key = uniqueKey();
        const held = await app.locks.acquire(key, { ttl: 30_000 });
        proxy.setLatency(150);
        const queued = app.locks.acquire(key, { ttl: 30_000, acquireTimeout: 10_000 });
        const attempts = (): number =>
          scriptCallsOf(monitor.commands, ACQUIRE_SCRIPT, `lock:{${key}}`).filter(
            ({ args }) => !args.includes(held.token),
          ).length;
        assert.ok(await eventually(() => attempts() >= 2), 'the waiter never went to sleep');
        // Taken behind the holder's back: the lease is lost, with 30 s of it left.
        await redis.set(`lock:{${key}}`, 'stranger', 'PX', 30_000);
        await assert.rejects(held.extend(), LockLostError);
        await redis.del(`lock:{${key}}`);
        const seen = attempts();
        assert.ok(await eventually(() => attempts() > seen, 3_000), 'the waiter never retried');
        // That retry found the key free: it holds it, its answer 150 ms away.
        assert.equal((await redis.get(`lock:{${key}}`)) === 'stranger', false);
        assert.equal(await held.release(), false);
        const next = await queued;
        assert.equal(await redis.get(`lock:{${key}}`), next.token);
        await next.release();
      },
    );
  });

  it('shutdown names the key an abandoned attempt may still hold when Redis has not answered by its deadline (found by mutation testing)', async () => {
    const { capture, restore } = LogCapture.install();
    try {
      await throughProxy({ commandTimeout: 300 }, async (proxy, slow) => {
        await slow.locks.isLocked(uniqueKey()); // a connection, before the partition
        const key = uniqueKey();
        proxy.stall(); // the attempt reaches Redis only after the app is gone
        const pending = slow.locks.acquire(key, { ttl: 1_000 });
        pending.catch(() => {}); // a shutdown error
        await sleep(50);
        await slow.locks.onApplicationShutdown();
        const warned = capture.lines.filter(
          ({ level, message }) => level === 'warn' && message.startsWith("Shutdown's deadline"),
        );
        assert.equal(warned.length, 1, JSON.stringify(capture.lines));
        assert.ok(warned[0].message.includes(JSON.stringify(key)), warned[0].message);
        proxy.heal();
      });
    } finally {
      restore();
    }
  });

  it('shutdown cuts short an acquisition waiting for its reply, never a release: that one is answered (found by mutation testing)', async () => {
    await throughProxy({ commandTimeout: 5_000 }, async (proxy, slow) => {
      const [freeKey, heldKey] = [uniqueKey(), uniqueKey()];
      const lock = await slow.locks.acquire(heldKey, { ttl: 30_000 });
      proxy.setLatency(400); // an 800 ms round trip
      const acquiring = slow.locks.acquire(freeKey, { ttl: 30_000 });
      acquiring.catch(() => {}); // asserted below
      const released = lock.release();
      await sleep(50); // both sent
      const stalls = watchStalls();
      const started = performance.now();
      const closing = slow.locks.onApplicationShutdown();
      await assert.rejects(acquiring, { name: 'RedisLockShutdownError' });
      // At once, not when its reply comes (~750 ms on).
      assertWithin(performance.now() - started, 0, stalls, 'the interrupted acquisition');
      stalls.stop();
      assert.equal(await released, true, 'the release in flight was cut short');
      await closing;
      proxy.setLatency(0);
      assert.equal(await redis.exists(`lock:{${freeKey}}`), 0, 'its late grant stayed');
    });
  });

  it('a waiter its process hands the lock to as shutdown begins gets no lock: the call rejects with RedisLockShutdownError and the key is freed (found by mutation testing)', async () => {
    const app = await startLockModule({ connection: server.url });
    try {
      const { key, held, queued } = await heldWithWaiter(app.locks, 10_000, 10_000);
      queued.catch(() => {}); // asserted below
      // The release hands the lock over in the process; shutdown begins before the heir runs.
      const released = held.release();
      const closing = app.locks.onApplicationShutdown();
      await assert.rejects(queued, { name: 'RedisLockShutdownError' });
      assert.equal(await released, true);
      await closing;
      assert.equal(await redis.exists(`lock:{${key}}`), 0, 'the lock handed over stayed in Redis');
    } finally {
      await app.close();
    }
  });

  it('a waiter whose subscription is not confirmed within commandTimeout waits on timers: it takes the key soon after its release, not at its deadline (found by mutation testing)', async () => {
    await throughProxy(
      { commandTimeout: 300, defaults: { retryInterval: 100, retryJitter: 0 } },
      async (proxy, slow) => {
        await slow.locks.isLocked(uniqueKey()); // the command connection, before the fault
        // The subscriber, opened by the first wait, never hears back.
        proxy.muteNewConnections();
        const key = uniqueKey();
        const held = await holder.acquire(key, { ttl: 20_000 });
        const waiting = slow.locks.acquire(key, { acquireTimeout: 15_000 });
        waiting.catch(() => {}); // (ends with the app if an assertion fails)
        await sleep(700); // past its wait for the subscription: polling
        const stalls = watchStalls();
        await held.release();
        const released = performance.now();
        const lock = await waiting;
        // At its next poll (at most the subscription's commandTimeout, then a retryInterval), not
        // at its deadline 14 s on.
        assertWithin(performance.now() - released, 300 + 100, stalls, 'the key taken by polling');
        stalls.stop();
        assert.equal(await lock.release(), true);
      },
    );
  });

  it('a wait cut short by the deadline ends just past it, with one last attempt (found by mutation testing)', async () => {
    // Polls further apart than the wait: its attempts are the first, the one once subscribed,
    // and the last, at the deadline.
    const app = await startLockModule({
      connection: server.url,
      defaults: { retryInterval: 5_000, retryJitter: 0 },
    });
    const key = uniqueKey();
    const held = await holder.acquire(key, { ttl: 30_000 });
    const attempts = await attemptsOn(key);
    try {
      for (let round = 1; round <= 6; round++) {
        const before = attempts.count();
        await assert.rejects(app.locks.acquire(key, { acquireTimeout: 300 }), {
          name: 'LockAcquireTimeoutError',
        });
        await attempts.caughtUp();
        // (Fewer where a stall ate the wait: never more.)
        const made = attempts.count() - before;
        assert.ok(made >= 1 && made <= 3, `round ${round}: ${made} attempts`);
      }
    } finally {
      attempts.stop();
      await held.release();
      await app.close();
    }
  });

  it('a waiter that hears no release polls every retryInterval plus up to retryJitter, never sooner (found by mutation testing)', async () => {
    const app = await startLockModule({
      connection: server.url,
      defaults: { retryInterval: 100, retryJitter: 100 },
    });
    const key = uniqueKey();
    const held = await holder.acquire(key, { ttl: 30_000 });
    const attempts = await attemptsOn(key);
    try {
      await assert.rejects(app.locks.acquire(key, { acquireTimeout: 1_500 }), {
        name: 'LockAcquireTimeoutError',
      });
      await attempts.caughtUp();
      // Its first attempt, the one once subscribed, the last at the deadline, and a poll every
      // 100-200 ms between (fewer on a slow machine, never more).
      const count = attempts.count();
      assert.ok(count <= 3 + 1_500 / 100, `${count} attempts in 1.5 s`);
      assert.ok(count >= 4, `${count} attempts in 1.5 s: it never polled`);
    } finally {
      attempts.stop();
      await held.release();
      await app.close();
    }
  });

  it('a release passes the lock straight to the first waiter of its process: the heir starts at once, one command, no message', async () => {
    const { key, held, queued } = await heldWithWaiter(waiter, 30_000, 20_000);
    const monitor = await monitorRedis(server.port);
    try {
      const releasedAt = performance.now();
      const released = held.release();
      const next = await queued;
      const grantedBy = performance.now();
      // Granted before Redis answered: the next fence of the held lock's block, on its lease but
      // no longer than its own TTL's (20 s less 1 % and 2 ms, from when it was passed on).
      assert.equal(next.fence, held.fence + 1);
      assert.ok(next.expiresAt <= held.expiresAt);
      assert.ok(
        next.expiresAt >= releasedAt + 19_798 && next.expiresAt <= grantedBy + 19_798,
        `expires ${next.expiresAt - releasedAt} ms after the release`,
      );
      assert.equal(await released, true);
      await assertHandedOver(monitor, key, PASS_ON_SCRIPT, next, 20_000);
      // Its lease now runs from its own write.
      assert.ok(
        next.expiresAt > held.expiresAt - 10_000 && next.expiresAt <= performance.now() + 20_000,
      );
      assert.equal(await next.release(), true);
    } finally {
      monitor.stop();
    }
  });

  it("a lock passed on in the process runs on what is left of the releaser's lease where that is shorter than the heir's own TTL", async () => {
    // 10 s left, more than half the heir's 15 s: passed on, on those 10 s, not on 15.
    const { held, queued } = await heldWithWaiter(waiter, 10_000, 15_000);
    const released = held.release();
    const next = await queued; // before its own write is answered
    assert.equal(next.fence, held.fence + 1, 'passed on in the process');
    assert.ok(
      next.expiresAt <= held.expiresAt,
      `the heir's lease ends ${(next.expiresAt - held.expiresAt).toFixed(0)} ms after the releaser's`,
    );
    assert.equal(await released, true);
    assert.equal(await next.release(), true);
  });

  it("a release hands the lock over through Redis when the lease has less than half the heir's TTL left: one command", async () => {
    const { key, held, queued } = await heldWithWaiter(waiter, 5_000, 11_000);
    const monitor = await monitorRedis(server.port);
    try {
      assert.equal(await held.release(), true);
      const next = await queued;
      await assertHandedOver(monitor, key, HANDOFF_SCRIPT, next, 11_000);
      // A new block of fences, taken in Redis.
      assert.ok(next.fence >= held.fence + FENCE_STRIDE, `${next.fence} after ${held.fence}`);
      assert.ok(next.expiresAt <= performance.now() + 11_000);
      assert.equal(await next.release(), true);
    } finally {
      monitor.stop();
    }
  });

  it('passes the lock on in the process until its block of fences is used up, then takes a new block through Redis; every fence unique and above the last', async () => {
    const key = uniqueKey();
    // A turn (handoffTurn) long enough for the whole chain: with the default 25 ms, a loaded
    // machine ended it before a block was used up (a failed gate run: no block used up).
    const app = await startLockModule({ connection: server.url, handoffTurn: 60_000 });
    const waiter = app.locks;
    const held = await waiter.acquire(key, { ttl: 30_000 });
    // Sections yield once (setImmediate, not a timer of at least 1 ms).
    const sections: { fence: number; lost: boolean; released: boolean }[] = [];
    const local = (): Promise<void>[] =>
      Array.from({ length: 2 * FENCE_STRIDE + 3 }, async () => {
        const lock = await waiter.acquire(key, { acquireTimeout: 10_000 });
        const section = { fence: lock.fence, lost: false, released: false };
        sections.push(section);
        await new Promise((resolve) => setImmediate(resolve));
        section.lost = lock.signal.aborted;
        section.released = await lock.release();
      });
    const kinds = await scriptsWhileReleasing(
      waiter,
      held,
      local,
      [[PASS_ON_SCRIPT, 'P']],
      'G',
    ).finally(() => app.close());
    // Each grant from Redis reserves a block: FENCE_STRIDE - 1 pass-ons (P) follow it, the first
    // after the held lock's grant, then one handoff through Redis (G) takes the next block, whose
    // heirs are passed on again. The turn (60 s) never ends meanwhile, so nothing else comes
    // between: 35 heirs are 15 P, G, 15 P, G, 3 P; the last release finds no waiter (G).
    const full = 'P'.repeat(FENCE_STRIDE - 1);
    assert.equal(kinds, `${full}G${full}GPPPG`);
    const fences = [held.fence, ...sections.map((s) => s.fence)];
    for (let i = 1; i < fences.length; i++) {
      assert.ok(fences[i] > fences[i - 1], `fences in order: ${fences.join(', ')}`);
    }
    assert.deepEqual(
      sections.filter((s) => s.lost || !s.released),
      [],
      'every heir held its lock to the end and released it',
    );
    assert.equal(await redis.exists(`lock:{${key}}`), 0);
    // No holder elsewhere can get a fence that was reserved for the process's heirs: the
    // counter stands at the end of the last block, and the next grant above it.
    const counter = Number(await redis.get('lock:{}:counter'));
    assert.ok(counter >= Math.max(...fences));
    const after = await holder.acquire(key);
    assert.ok(after.fence > counter, `${after.fence} after ${counter}`);
    await after.release();
  });

  it('with fenceRetention 0 no fences are reserved: a handoff goes through Redis and takes one fence', async () => {
    // A prefix of its own: a counter of its own.
    const app = await startLockModule({
      connection: server.url,
      fenceRetention: 0,
      keyPrefix: 'zero:',
    });
    try {
      const key = uniqueKey();
      const held = await app.locks.acquire(key, { ttl: 30_000 });
      assert.equal(Number(await redis.get('zero:{}:counter')), held.fence);
      const monitor = await monitorRedis(server.port);
      try {
        const queued = app.locks.acquire(key, { ttl: 30_000, acquireTimeout: 10_000 });
        const calls = (script: string, from = 0): number =>
          scriptCalls(monitor.commands.slice(from), script, `zero:{${key}}`);
        // Asleep: its attempt and its attempt once subscribed have run.
        assert.ok(
          await eventually(() => calls(ACQUIRE_UNRESERVED_SCRIPT) >= 2),
          'the waiter is asleep',
        );
        await monitor.caughtUp();
        const from = monitor.commands.length;
        assert.equal(await held.release(), true);
        const next = await queued;
        await monitor.caughtUp();
        assert.equal(calls(ACQUIRE_UNRESERVED_SCRIPT, from), 0);
        assert.equal(calls(HANDOFF_UNRESERVED_SCRIPT, from), 1);
        assert.equal(calls(PASS_ON_SCRIPT, from) + calls(HANDOFF_SCRIPT, from), 0);
        assert.ok(next.fence > held.fence);
        // One fence taken: the counter stands at it, no block beyond.
        assert.equal(Number(await redis.get('zero:{}:counter')), next.fence);
        assert.equal(await next.release(), true);
        assert.equal(await redis.exists(`zero:{${key}}`, `zero:{${key}}:fence`), 0);
      } finally {
        monitor.stop();
      }
    } finally {
      await app.close();
    }
  });

  it('an heir passed a lock that was already gone from Redis loses it (signal, release false), and its fence is never given to anyone else', async () => {
    const { key, held, queued } = await heldWithWaiter(waiter, 30_000, 30_000);
    await redis.del(`lock:{${key}}`); // deleted by hand behind the holder's back
    const released = held.release();
    const next = await queued; // started before Redis could say
    assert.equal(next.fence, held.fence + 1);
    // An extension asked for meanwhile waits for the heir's own write, and fails with it.
    const extended = next.extend().catch((error: unknown) => error);
    assert.equal(await released, false);
    const refused = await extended;
    assert.ok(refused instanceof LockLostError && refused.reason === 'not-held', String(refused));
    assert.ok(await eventually(() => next.signal.aborted, 2_000), 'the heir is told');
    const reason = next.signal.reason as LockLostError;
    assert.ok(reason instanceof LockLostError);
    assert.equal(reason.reason, 'not-held');
    const other = await holder.acquire(key);
    assert.ok(other.fence > next.fence + 1, `${other.fence} after ${next.fence}`);
    assert.equal(await next.release(), false);
    await other.release();
  });

  it('a lock known lost is not passed on in the process: its sleeping waiter is not handed a key another owner holds', async () => {
    // 30 s left, more than half the heir's TTL: but for the loss, it would be passed on.
    const { key, held, queued } = await heldWithWaiter(waiter, 30_000, 30_000);
    await redis.set(`lock:{${key}}`, 'stranger', 'PX', 30_000); // taken behind the holder's back
    await assert.rejects(held.extend(), LockLostError);
    assert.equal(await held.release(), false);
    // Handed over through Redis, which refuses: the waiter waits on.
    const early = await Promise.race([
      queued.then(() => 'granted'),
      sleep(300).then(() => 'waiting'),
    ]);
    assert.equal(early, 'waiting');
    assert.equal(await redis.get(`lock:{${key}}`), 'stranger');
    await redis.del(`lock:{${key}}`);
    const next = await queued; // at its next retry
    assert.equal(await redis.get(`lock:{${key}}`), next.token);
    assert.equal(await next.release(), true);
  });

  it('a lease confirmed before the connection was last lost is not passed on in the process: Redis may have forgotten it and granted the key elsewhere (a failover, a restart)', async () => {
    const proxy = await FaultProxy.start(() => server.port);
    const app = await startLockModule({ connection: `redis://127.0.0.1:${proxy.port}` });
    try {
      const key = uniqueKey();
      const { held, assertHeirAfter } = await heldWithHeir(app.locks, key, redis);
      // The app's connection is lost and kept from coming back (a partition), and Redis forgets
      // the lock, as a master killed before its replica had it would once the replica took over:
      // another app takes the key, with a fence from the server's clock.
      proxy.dropAll();
      proxy.stall();
      await redis.del(`lock:{${key}}`);
      const other = await holder.acquire(key, { ttl: 30_000 });
      const released = held.release().catch((error: unknown) => error);
      await sleep(300);
      proxy.heal();
      await assertHeirAfter(other, false);
      assert.equal(await released, false, 'the holder is told the lock was no longer its own');
    } finally {
      await app.close();
      await proxy.close();
    }
  });

  it('an heir that extends or releases before its own write is answered waits for it', async () => {
    const proxy = await FaultProxy.start(() => server.port);
    const slow = await startLockModule({ connection: `redis://127.0.0.1:${proxy.port}` });
    try {
      await (await slow.locks.acquire(uniqueKey())).release(); // connection and scripts ready
      const { key, held, queued } = await heldWithWaiter(slow.locks, 30_000, 30_000);
      proxy.setLatency(100);
      const settled: string[] = [];
      const released = held.release().finally(() => settled.push('the write over ours'));
      const next: Lock = await queued;
      settled.push('the heir');
      await next.extend(20_000);
      settled.push('the extension');
      // Granted before Redis answered the write of its token over ours (release() resolves with
      // that answer), and the extension went out only after it.
      assert.deepEqual(settled, ['the heir', 'the write over ours', 'the extension']);
      assert.equal(await released, true);
      assert.equal(await next.release(), true);
      assert.equal(await redis.exists(`lock:{${key}}`), 0);
    } finally {
      await slow.close();
      await proxy.close();
    }
  });

  it('an extension of an heir waiting for its own write, released meanwhile, resolves and is never sent (found by mutation testing)', async () => {
    await throughProxy({}, async (proxy, slow, monitor) => {
      await (await slow.locks.acquire(uniqueKey())).release(); // connection and scripts ready
      const { key, held, queued } = await heldWithWaiter(slow.locks, 30_000, 30_000);
      proxy.setLatency(100);
      const released = held.release();
      const next: Lock = await queued; // passed on: its own write is on its way
      const extended = next.extend(20_000); // waits for that write
      assert.equal(await next.release(), true);
      await extended; // released meanwhile: nothing to extend, and no loss
      assert.equal(await released, true);
      assert.equal(next.signal.aborted, false, 'release is not a loss');
      await monitor.caughtUp();
      assert.equal(scriptCalls(monitor.commands, EXTEND_SCRIPT, `lock:{${key}}`), 0);
    });
  });

  /**
   * In a module with `handoffTurn`, `count` callers queue on a held key, each holding it for
   * `sectionMs`; returns the lock scripts Redis ran on the key once it is released (see
   * `scriptsWhileReleasing`): P pass-on, H handoff through Redis, R release, A anything else.
   */
  async function scriptsWithTurn(
    handoffTurn: number,
    count: number,
    sectionMs: number,
  ): Promise<string> {
    const app = await startLockModule({ connection: server.url, handoffTurn });
    try {
      const held = await app.locks.acquire(uniqueKey(), { ttl: 30_000 });
      const local = (): Promise<void>[] =>
        Array.from({ length: count }, () =>
          app.locks.using(held.key, () => sleep(sectionMs), { acquireTimeout: 10_000 }),
        );
      const letters: Parameters<typeof scriptSequence>[2] = [
        [PASS_ON_SCRIPT, 'P'],
        [HANDOFF_SCRIPT, 'H'],
        [RELEASE_SCRIPT, 'R'],
      ];
      return await scriptsWhileReleasing(app.locks, held, local, letters, 'A');
    } finally {
      await app.close();
    }
  }

  it('hands over within a turn of handoffTurn ms; the first release after it frees the lock, so waiters in other processes get a turn', async () => {
    // Each section (30 ms) outlasts a turn (25 ms): every other release ends one. Six sections
    // after the first: a handoff (passed on in the process) starts a turn; the next release, past
    // the turn, frees the lock and publishes it, and the woken waiter attempts; its release
    // starts a new turn with a handoff; and so on, then the last release.
    assert.equal(await scriptsWithTurn(25, 6, 30), 'PRAPRAPRAR');
  });

  it('with handoffTurn 0 every release frees the lock: no waiter is handed it in the process', async () => {
    // Nobody else waits, so this process's waiters do not hold back: each release is followed
    // by the next waiter's own attempt at once.
    assert.equal(await scriptsWithTurn(0, 4, 1), 'RARARARAR');
  });

  it('at the end of its turn (handoffTurn, 25 ms by default) the releasing process holds back, and a waiter in another process takes its turn', async () => {
    const key = uniqueKey();
    const held = await waiter.acquire(key, { ttl: 30_000 });
    const order: string[] = [];
    const section = (name: string) => async (): Promise<void> => {
      order.push(name);
      await sleep(DEFAULT_HANDOFF_TURN + 5);
    };
    const local = Array.from({ length: 6 }, (_, i) =>
      waiter.using(key, section(`local${i}`), { acquireTimeout: 10_000 }),
    );
    const remote = holder.using(key, section('remote'), { acquireTimeout: 10_000 });
    // All queued: six in this process, one in the other.
    await queuedIn(waiter, key, 6);
    await queuedIn(holder, key, 1);
    await held.release();
    await Promise.all([...local, remote]);
    // Handed over in this process (a turn begins); the release after the turn frees the lock and
    // this process yields it: its waiters hold back while the other process's waiter, woken by
    // the release, takes it (on an idle machine, at the first yield: ['local0', 'remote', ...]).
    // A yield lasts 5 ms, and a loaded machine may wake the other process later than that; then
    // the next turn's end yields again. The other process is never left for last.
    assert.equal(order[0], 'local0');
    assert.ok(order.indexOf('remote') < order.length - 1, order.join(', '));
    assert.equal(order.length, 7);
  });

  it('with handoffTurn 0 a release with waiters in this process and another lets the other one in first', async () => {
    const app = await startLockModule({ connection: server.url, handoffTurn: 0 });
    try {
      const key = uniqueKey();
      const held = await app.locks.acquire(key, { ttl: 30_000 });
      const order: string[] = [];
      const section = (name: string) => async (): Promise<void> => {
        order.push(name);
        await sleep(1);
      };
      const local = Array.from({ length: 3 }, (_, i) =>
        app.locks.using(key, section(`local${i}`), { acquireTimeout: 10_000 }),
      );
      const remote = holder.using(key, section('remote'), { acquireTimeout: 10_000 });
      // All queued: three in this process, one in the other.
      await queuedIn(app.locks, key, 3);
      await queuedIn(holder, key, 1);
      await held.release();
      await Promise.all([...local, remote]);
      // Nothing is passed on in the process: the release frees the lock, this process's waiters
      // hold back, and the other process's waiter takes it (on an idle machine, at the first
      // release; a loaded one may wake it after the 5 ms the waiters hold back, and then at a
      // later release). It is never left for last.
      assert.ok(order.indexOf('remote') < order.length - 1, order.join(', '));
      assert.equal(order.length, 4);
    } finally {
      await app.close();
    }
  });

  it('a waiter that gives up while the lock is being handed to it leaves nothing behind', async () => {
    const proxy = await FaultProxy.start(() => server.port);
    const slow = await startLockModule({ connection: `redis://127.0.0.1:${proxy.port}` });
    try {
      const key = uniqueKey();
      await (await slow.locks.acquire(uniqueKey())).release(); // connection and scripts ready
      // The heir's TTL is over twice what the lease has left: handed over through Redis.
      const held = await slow.locks.acquire(key, { ttl: 30_000 });
      const giveUp = new AbortController();
      const queued = slow.locks.acquire(key, {
        ttl: 70_000,
        acquireTimeout: 10_000,
        signal: giveUp.signal,
      });
      await queuedIn(slow.locks, key, 1);
      proxy.setLatency(150);
      const released = held.release(); // the handoff is on its way
      await sleep(50);
      giveUp.abort();
      await assert.rejects(queued, LockAcquireAbortedError);
      assert.equal(await released, true);
      // The handoff went through after the heir left: its lock is released for it.
      assert.ok(await eventually(async () => (await redis.exists(`lock:{${key}}`)) === 0, 2_000));
    } finally {
      await slow.close();
      await proxy.close();
    }
  });

  for (const elsewhere of [false, true]) {
    it(`a first waiter passed the lock in its process while its retry is on its way, and giving up before that retry is answered: the lock passed to it is released for it${elsewhere ? ', also while the process waits for another key' : ''}`, async () => {
      // Through a link slow enough (250 ms each way) to give up while the retry's answer is coming.
      const proxy = await FaultProxy.start(() => server.port);
      const app = await startLockModule({
        connection: `redis://127.0.0.1:${proxy.port}`,
        defaults: { retryInterval: 300, retryJitter: 0 },
      });
      const monitor = await monitorRedis(server.port);
      // Another key held and waited for in the process: its release (which has no lease of its
      // own) is made while the process watches a channel.
      const other = elsewhere ? await heldWithWaiter(app.locks, 30_000, 30_000) : undefined;
      try {
        const key = uniqueKey();
        // 30 s left, more than half the heir's 30 s: passed on in the process.
        const held = await app.locks.acquire(key, { ttl: 30_000 });
        proxy.setLatency(250);
        const giveUp = new AbortController();
        const queued = app.locks.acquire(key, {
          ttl: 30_000,
          acquireTimeout: 10_000,
          signal: giveUp.signal,
        });
        // Its attempt, its attempt once subscribed, then its next retry reached Redis: the
        // retry's answer is 250 ms away.
        const attempts = (): number =>
          scriptCallsOf(monitor.commands, ACQUIRE_SCRIPT, `lock:{${key}}`).filter(
            ({ args }) => !args.includes(held.token),
          ).length;
        assert.ok(await eventually(() => attempts() >= 2), 'the waiter never went to sleep');
        const seen = attempts();
        assert.ok(await eventually(() => attempts() > seen, 3_000), 'the waiter never retried');
        const released = held.release(); // passed to the waiter at once, in the process
        await sleep(20);
        giveUp.abort();
        await assert.rejects(queued, LockAcquireAbortedError);
        assert.equal(await released, true);
        // Its token written over the releaser's, then released for it: the key is free, long
        // before the heir's 30 s TTL.
        assert.ok(await eventually(async () => (await redis.exists(`lock:{${key}}`)) === 0, 2_000));
        await monitor.caughtUp();
        assert.equal(scriptCalls(monitor.commands, PASS_ON_SCRIPT, `lock:{${key}}`), 1);
      } finally {
        monitor.stop();
        if (other) {
          await other.held.release();
          await (await other.queued).release();
        }
        await app.close();
        await proxy.close();
      }
    });
  }

  it('a handoff through Redis that fails: the release rejects with LockBackendError, and the heir tries by itself at once', async () => {
    const own = await startRedis();
    const app = await startLockModule({
      connection: own.url,
      defaults: { retryInterval: 5_000, retryJitter: 0 },
    });
    const direct = new Redis(own.port, '127.0.0.1');
    const monitor = await monitorRedis(own.port);
    try {
      const key = uniqueKey();
      // Less than half the heir's TTL left: handed over through Redis.
      const held = await app.locks.acquire(key, { ttl: 5_000 });
      const queued = app.locks.acquire(key, { ttl: 11_000, acquireTimeout: 10_000 });
      const attempts = (): number =>
        scriptCallsOf(monitor.commands, ACQUIRE_SCRIPT, `lock:{${key}}`).filter(
          ({ args }) => args[0] === 'evalsha' && !args.includes(held.token),
        ).length;
      assert.ok(await eventually(() => attempts() >= 2), 'the waiter never went to sleep');
      // Out of memory: every script that writes fails before its first write.
      await direct.config('SET', 'maxmemory', '1');
      const stalls = watchStalls();
      const releasedAt = performance.now();
      await assert.rejects(held.release(), LockBackendError);
      // Woken, not left to its next retry 5 s away: its own attempt meets the same failure.
      await assert.rejects(queued, LockBackendError);
      assertWithin(performance.now() - releasedAt, 500, stalls, 'the heir, after the release');
      stalls.stop();
      await monitor.caughtUp();
      assert.equal(
        scriptCallsOf(monitor.commands, HANDOFF_SCRIPT, `lock:{${key}}`).filter(
          ({ args }) => args[0] === 'evalsha',
        ).length,
        1,
      );
      // Nothing changed in Redis: the releaser's token until its TTL.
      assert.equal(await direct.get(`lock:{${key}}`), held.token);
    } finally {
      monitor.stop();
      await direct.config('SET', 'maxmemory', '0');
      direct.disconnect();
      await app.close();
      await own.stop();
    }
  });

  it('idle waiters in one process poll as one: an attempt per retryInterval, not one per waiter', async () => {
    const key = uniqueKey();
    const held = await holder.acquire(key, { ttl: 30_000 });
    const attempts = await attemptsOn(key);
    try {
      const parked = Array.from({ length: 50 }, () =>
        waiter.acquire(key, { acquireTimeout: 20_000 }).then((lock) => lock.release()),
      );
      // Started in one tick: each made its attempt and one more once subscribed; then the first
      // polls and the others sleep in the queue.
      await queuedIn(waiter, key, 50);
      await attempts.asleep(100);
      await attempts.caughtUp();
      const before = attempts.count();
      await sleep(3_000);
      await attempts.caughtUp();
      const polls = attempts.count() - before;
      // retryInterval is 1 s (+ up to 50 ms jitter): the first waiter polls about 3 times; fifty
      // waiters each on their own timer would send about 150 attempts.
      assert.ok(polls >= 2 && polls <= 3, `${polls} attempts in 3 s from 50 idle waiters`);
      await held.release();
      await Promise.all(parked);
    } finally {
      attempts.stop();
    }
  });

  it('a release whose message is lost costs at most retryInterval, never a hang', async () => {
    const app = await startLockModule({
      connection: server.url,
      defaults: { retryInterval: 300, retryJitter: 0 },
    });
    const key = uniqueKey();
    await holder.acquire(key, { ttl: 30_000 });
    const attempts = await attemptsOn(key);
    try {
      const waiting = app.locks.acquire(key, { acquireTimeout: 5_000 });
      // Asleep: its attempt, and its attempt once subscribed. (Counted as queued once it found the
      // key held, it may still be subscribing: under load, its attempt once subscribed found the
      // key already freed, 7 ms after.)
      await attempts.asleep(2);
      attempts.stop();
      // The lock goes away with no release message at all, as if the message had been lost.
      const watch = watchStalls();
      const freedAt = performance.now();
      await redis.del(`lock:{${key}}`);
      const lock = await waiting;
      const waited = performance.now() - freedAt;
      assert.ok(waited >= 50, `found after ${waited.toFixed(0)} ms: not by its retry timer`);
      assertWithin(waited, 300, watch, 'the wait after a lost release message (retryInterval 300)');
      watch.stop();
      await lock.release();
    } finally {
      attempts.stop();
      await app.close();
    }
  });

  it('an AbortSignal cancels the wait with LockAcquireAbortedError', async () => {
    const key = uniqueKey();
    const held = await holder.acquire(key);
    const controller = new AbortController();
    const pending = waiter.acquire(key, { acquireTimeout: 10_000, signal: controller.signal });
    await queuedIn(waiter, key, 1);
    const watch = watchStalls();
    const abortedAt = performance.now();
    controller.abort(new Error('client went away'));
    const error = await pending.catch((e: unknown) => e);
    assert.ok(error instanceof LockAcquireAbortedError);
    assert.equal(error.key, key);
    // At once, not at acquireTimeout (10 s).
    assertWithin(performance.now() - abortedAt, 0, watch, 'the rejection after the abort');
    watch.stop();
    await assert.rejects(
      waiter.acquire(key, { signal: AbortSignal.abort() }),
      LockAcquireAbortedError,
      'an already aborted signal fails at once',
    );
    await held.release();
  });

  it('a wait adds no listener per waiter to a shared signal: 40 callers on one key, with one AbortSignal, warn of no leak', async () => {
    const key = uniqueKey();
    const held = await holder.acquire(key, { ttl: 30_000 });
    const warnings: Error[] = [];
    const onWarning = (warning: Error): void => void warnings.push(warning);
    process.on('warning', onWarning);
    try {
      const controller = new AbortController();
      const waits = Array.from({ length: 40 }, () =>
        waiter.acquire(key, { acquireTimeout: 10_000, signal: controller.signal }),
      );
      // Every caller is waiting (the first polls, the others sleep in the queue).
      await queuedIn(waiter, key, 40);
      assert.ok(
        getEventListeners(controller.signal, 'abort').length <= 1,
        `${getEventListeners(controller.signal, 'abort').length} listeners on one shared signal`,
      );
      controller.abort();
      const outcomes = await Promise.allSettled(waits);
      assert.ok(outcomes.every((outcome) => outcome.status === 'rejected'));
      // Node reports a listener leak on the next tick.
      await sleep(10);
      assert.deepEqual(
        warnings.map((warning) => warning.name),
        [],
        warnings.map(String).join('; '),
      );
    } finally {
      process.off('warning', onWarning);
      await held.release();
    }
  });

  it('an aborted waiter does not swallow the wake-up meant for the next one', async () => {
    const key = uniqueKey();
    const held = await holder.acquire(key, { ttl: 30_000 });
    const app = await startNonPollingApp({ connection: server.url });
    try {
      const controller = new AbortController();
      const first = app.locks.acquire(key, { acquireTimeout: 10_000, signal: controller.signal });
      await queuedIn(app.locks, key, 1);
      const second = app.locks.acquire(key, { acquireTimeout: 10_000 });
      await queuedIn(app.locks, key, 2);
      controller.abort();
      await assert.rejects(first, LockAcquireAbortedError);
      await held.release();
      // Its next poll is 60 s away: the release's wake-up reached it.
      await (await second).release();
    } finally {
      await app.close();
    }
  });

  it('an attempt in flight at the deadline counts if its reply comes within commandTimeout: acquire() and tryAcquire() get the lock', async () => {
    const proxy = await FaultProxy.start(() => server.port);
    const slow = await startLockModule({
      connection: `redis://127.0.0.1:${proxy.port}`,
      commandTimeout: 3_000,
    });
    try {
      await (await slow.locks.acquire(uniqueKey())).release(); // connection and scripts ready
      proxy.setLatency(150); // each way: a round trip of 300 ms, past each deadline below
      for (const take of [
        (key: string) => slow.locks.acquire(key, { acquireTimeout: 50 }),
        (key: string) => slow.locks.tryAcquire(key),
      ]) {
        const key = uniqueKey();
        const started = performance.now();
        const lock = await take(key);
        const took = performance.now() - started;
        assert.ok(lock, 'the attempt in flight at the deadline did not count');
        assert.ok(took >= 290, `answered after ${took.toFixed(0)} ms: not past the deadline`);
        assert.equal(await redis.get(`lock:{${key}}`), lock.token);
        assert.equal(await lock.release(), true);
      }
    } finally {
      await slow.close();
      await proxy.close();
    }
  });

  it('a frozen Redis fails an acquisition with LockBackendError after commandTimeout, and the late grant is released', async () => {
    const frozen = await startRedis();
    const app = await startLockModule({ connection: frozen.url, commandTimeout: 400 });
    try {
      await (await app.locks.acquire(uniqueKey())).release(); // connected
      const key = uniqueKey();
      const ownTokenKey = uniqueKey('own-token');
      frozen.signal('SIGSTOP');
      const watch = watchStalls();
      const started = performance.now();
      const [error, ownTokenError] = await Promise.all([
        app.locks.acquire(key, { acquireTimeout: 2_000 }).catch((e: unknown) => e),
        app.locks
          .acquire(ownTokenKey, { acquireTimeout: 2_000, token: 'caller-token' })
          .catch((e: unknown) => e),
      ]);
      const elapsed = performance.now() - started;
      assert.ok(error instanceof LockBackendError, String(error));
      assert.ok(ownTokenError instanceof LockBackendError, String(ownTokenError));
      assert.equal(error.operation, 'acquire');
      assert.equal(error.timedOut, true);
      // The silent reply ends the call, not the (much longer) acquireTimeout.
      assert.ok(elapsed >= 400 - 50, `${elapsed} ms`);
      assertWithin(elapsed, 400, watch, 'acquire() on a frozen Redis (commandTimeout 400)');
      watch.stop();

      // Thawed, Redis runs the abandoned attempts and grants both locks. The library releases the
      // one it took with its own token; a caller's token may already hold it, so that one stays.
      frozen.signal('SIGCONT');
      const direct = new Redis(frozen.port, frozen.host);
      try {
        assert.ok(
          await eventually(async () => (await direct.exists(`lock:{${ownTokenKey}}`)) === 1, 2_000),
        );
        assert.ok(
          await eventually(async () => (await direct.exists(`lock:{${key}}`)) === 0, 2_000),
          'the late grant was released',
        );
        assert.ok(await direct.exists('lock:{}:counter'), 'it was granted before being released');
      } finally {
        direct.disconnect();
      }
    } finally {
      frozen.signal('SIGCONT');
      await app.close();
      await frozen.stop();
    }
  });

  for (const [name, call, deadline] of [
    ['tryAcquire()', (locks: LockService, key: string) => locks.tryAcquire(key), 0],
    [
      'acquire() with a 50 ms acquireTimeout',
      (locks: LockService, key: string) => locks.acquire(key, { acquireTimeout: 50 }),
      50,
    ],
  ] as const) {
    it(`${name} meeting this process's own given-up attempt on the key is not busy: it waits for that attempt's undo and tries once more, within its deadline + 3 × commandTimeout`, async () => {
      const proxy = await FaultProxy.start(() => server.port);
      // A 280 ms round trip against a 600 ms commandTimeout: every reply in time, with room for a
      // loaded machine (at 300 ms, a CPU burner made the release's reply miss it: test:repeat).
      const app = await startLockModule({
        connection: `redis://127.0.0.1:${proxy.port}`,
        commandTimeout: 600,
      });
      try {
        await (await app.locks.acquire(uniqueKey())).release(); // the connection and scripts warm
        proxy.setLatency(140);
        const key = uniqueKey();
        const controller = new AbortController();
        const first = app.locks.tryAcquire(key, { signal: controller.signal });
        setTimeout(() => controller.abort(new Error('the caller went away')), 5);
        await assert.rejects(first, LockAcquireAbortedError);
        // The first attempt's grant is on its way; once it lands, it is undone.
        const watch = watchStalls();
        const started = performance.now();
        const second = await call(app.locks, key);
        const elapsed = performance.now() - started;
        assert.ok(second, 'busy with its own given-up attempt');
        // Its attempt finds the late grant, waits for the undo, then tries again: three round
        // trips, past the deadline if need be (found by a helper for acquire(): the documented
        // bound said acquireTimeout + commandTimeout).
        assertWithin(elapsed, deadline + 3 * 600, watch, `${name} behind its own undo`);
        watch.stop();
        proxy.setLatency(0);
        await second.release();
      } finally {
        proxy.setLatency(0);
        await app.close();
        await proxy.close();
      }
    });
  }

  it('a subscriber reset while it subscribes again after a reconnection: no unhandled rejection, and it subscribes again', async () => {
    const proxy = await FaultProxy.start(() => server.port);
    const app = await startLockModule({ connection: `redis://127.0.0.1:${proxy.port}` });
    const unhandled: unknown[] = [];
    const onUnhandled = (reason: unknown): number => unhandled.push(reason);
    process.on('unhandledRejection', onUnhandled);
    try {
      const key = uniqueKey();
      const channel = `lock:{${key}}:released`;
      const subscribed = async (): Promise<boolean> =>
        ((await redis.pubsub('NUMSUB', channel)) as [string, number])[1] === 1;
      const held = await holder.acquire(key, { ttl: 30_000 });
      const queued = app.locks.acquire(key, { acquireTimeout: 20_000 });
      queued.catch(() => {}); // awaited below; a failed assertion before must not leave it unhandled
      assert.ok(await eventually(subscribed), 'the waiter subscribed');
      const { backend } = (
        app.locks as unknown as {
          engine: { backend: { notifier: { subscribers: Redis[] } } };
        }
      ).engine;
      const [subscriber] = backend.notifier.subscribers;
      // Only the subscriber's connection is reset: the waiter's attempts on the command connection
      // must not fail (an attempt that loses its connection fails the acquisition, as documented).
      const resetSubscriber = (): void =>
        proxy.drop((subscriber as unknown as { stream: Socket }).stream.localPort!);
      // Reset; once the subscriber is back (ready, its SUBSCRIBE written), reset it again before
      // the reply can come. ioredis' own resubscription left that SUBSCRIBE's rejection unhandled.
      const backAgain = new Promise((resolve) =>
        subscriber.once('ready', () => {
          resetSubscriber();
          subscriber.once('ready', resolve);
        }),
      );
      resetSubscriber();
      await backAgain;
      assert.ok(await eventually(subscribed), 'the subscriber did not subscribe again');
      // Give a late rejection the turns of the event loop it needs to be reported.
      await sleep(50);
      assert.deepEqual(unhandled.map(String), []);
      await held.release();
      await (await queued).release();
    } finally {
      process.off('unhandledRejection', onUnhandled);
      await app.close();
      await proxy.close();
    }
  });

  it('a waiter whose last grant came too late leaves the queue of waiting processes, also when Redis lost the release script (found by the model suite)', async () => {
    // A server of its own: its scripts are flushed.
    const own = await startRedis();
    const apps = await Promise.all([0, 1].map(() => startLockModule({ connection: own.url })));
    const admin = new Redis(own.port, '127.0.0.1');
    try {
      const key = uniqueKey();
      const turns = `lock:{${key}}:turns`;
      await apps[0].locks.acquire(key, { ttl: 150 }); // runs out by itself
      // Redis forgets its scripts (a restart); another instance's give-up loaded its own again.
      await admin.script('FLUSH');
      await admin.script('LOAD', DROP_MARK_SCRIPT);
      const waiting = apps[1].locks.acquire(key, { ttl: 150, acquireTimeout: 300 });
      assert.ok(await eventually(async () => (await admin.exists(turns)) === 1), 'never queued');
      // Redis stops for everyone: the waiter's last attempt, sent at its deadline, is granted
      // after its 150 ms lease, so it is undone (a release, which takes the NOSCRIPT detour),
      // and the waiter gives up. The release must not put its process back in the queue after
      // the give-up took it out.
      await admin.client('PAUSE', '700');
      await assert.rejects(waiting, LockAcquireTimeoutError);
      assert.ok(
        await eventually(async () => (await admin.exists(turns)) === 0, 2_000),
        `the process stayed queued: ${JSON.stringify(await admin.zrange(turns, '0', '-1'))}`,
      );
    } finally {
      admin.disconnect();
      await Promise.all(apps.map((app) => app.close()));
      await own.stop();
    }
  });

  it('a writer with its own token that gives up while its attempt is on its way takes its mark off the read lock after that attempt is answered, also when the attempt takes the NOSCRIPT detour (found by mutation testing)', async () => {
    // A server of its own: its scripts are flushed.
    const own = await startRedis();
    const proxy = await FaultProxy.start(() => own.port);
    const other = await startLockModule({ connection: own.url });
    const app = await startLockModule({ connection: `redis://127.0.0.1:${proxy.port}` });
    const admin = new Redis(own.port, '127.0.0.1');
    const monitor = await monitorRedis(own.port);
    try {
      const key = uniqueKey();
      const lockKey = `lock:{${key}}`;
      const reader = await other.locks.acquire(key, { mode: 'read', ttl: 30_000 });
      await app.locks.isLocked(uniqueKey()); // a connection, before the latency
      // Redis forgets its scripts (a restart); another instance's give-up loaded its own again.
      await admin.script('FLUSH');
      await admin.script('LOAD', DROP_MARK_SCRIPT);
      // The writer's attempt reaches Redis at ~100 ms (NOSCRIPT), and as EVAL at ~300, where it
      // marks the read lock (new readers wait); its give-up, sent at ~30 ms, must take the mark
      // off after that, not overtake it at ~130. (A caller's own token leaves no undo to wait
      // for: a generated token's given-up attempt does, and its give-up waits for that.)
      proxy.setLatency(100);
      const gone = new AbortController();
      const writing = app.locks.acquire(key, {
        token: 'writer-own',
        acquireTimeout: 30_000,
        signal: gone.signal,
      });
      await sleep(30);
      gone.abort(new Error('gone'));
      await assert.rejects(writing, LockAcquireAbortedError);
      assert.ok(
        await eventually(
          () => monitor.commands.some(({ args }) => args[0] === 'eval' && args[3] === lockKey),
          3_000,
        ),
        'the attempt was never sent again as EVAL',
      );
      proxy.setLatency(0);
      await sleep(500); // the give-up, if it waited, lands after it (the mark stays ~4 s)
      await monitor.caughtUp();
      assert.equal(await admin.hexists(lockKey, ''), 0, 'the mark stayed: new readers wait');
      await reader.release();
    } finally {
      monitor.stop();
      admin.disconnect();
      await other.close();
      await app.close();
      await proxy.close();
      await own.stop();
    }
  });

  it('a waiter that gives up as a holder of its process releases leaves the queue of waiting processes, also when Redis lost the release script (found by a helper)', async () => {
    // A server of its own: its scripts are flushed.
    const own = await startRedis();
    const proxy = await FaultProxy.start(() => own.port);
    const other = await startLockModule({ connection: own.url });
    // Every release names the next process (handoffTurn 0): no direct hand-over in the process.
    const app = await startNonPollingApp({
      connection: `redis://127.0.0.1:${proxy.port}`,
      handoffTurn: 0,
    });
    const admin = new Redis(own.port, '127.0.0.1');
    try {
      const key = uniqueKey();
      const turns = `lock:{${key}}:turns`;
      const held = await app.locks.acquire(key, { ttl: 30_000 });
      const gone = new AbortController();
      const waiting = app.locks.acquire(key, { acquireTimeout: 30_000, signal: gone.signal });
      // Another process queued too, so that the release has someone to name.
      const elsewhere = other.locks.acquire(key, { acquireTimeout: 30_000 });
      assert.ok(
        await eventually(async () => (await admin.zcard(turns)) === 2),
        `never both queued: ${JSON.stringify(await admin.zrange(turns, '0', '-1'))}`,
      );
      // Redis forgets its scripts (a restart); another instance's give-up loaded its own again.
      await admin.script('FLUSH');
      await admin.script('LOAD', DROP_MARK_SCRIPT);
      // The release, sent while its process's waiter still waits, puts the process at the back of
      // the queue; through a 100 ms/way link it reaches Redis at ~100 ms and, after NOSCRIPT, at
      // ~300. The give-up sent at ~30 ms (at Redis ~130) must not be overtaken by it: the process
      // would stay queued with nobody of it waiting, ahead of others.
      proxy.setLatency(100);
      const released = held.release();
      await sleep(30);
      gone.abort(new Error('gone'));
      await assert.rejects(waiting, LockAcquireAbortedError);
      assert.equal(await released, true);
      proxy.setLatency(0);
      // The release named the other process and took it out of the queue, and the give-up (on
      // its way still) takes this one out: nobody is left there.
      const next = await elsewhere;
      assert.ok(
        await eventually(async () => (await admin.exists(turns)) === 0, 2_000),
        `the process stayed queued with nobody of it waiting (the next release would name it): ${JSON.stringify(await admin.zrange(turns, '0', '-1'))}`,
      );
      await next.release();
    } finally {
      admin.disconnect();
      await other.close();
      await app.close();
      await proxy.close();
      await own.stop();
    }
  });

  for (const [name, shape] of [
    ['a place in a semaphore', { limit: 2 }],
    ['a read lock', { mode: 'read' }],
  ] as const) {
    it(`${name} whose grant came after its lease is given back, and the call goes on to one on time (found by mutation testing)`, async () => {
      await throughProxy(
        // Its late answer is held 1.7 s: within commandTimeout, so that it comes, late.
        { commandTimeout: 3_000, defaults: { retryInterval: 100, retryJitter: 0 } },
        async (proxy, slow, monitor) => {
          await slow.locks.isLocked(uniqueKey()); // connected
          const key = uniqueKey();
          proxy.holdReplies();
          // A lease of 1.5 s: the one granted on time outlasts any stall before its release.
          const late = slow.locks.acquire(key, { ...shape, ttl: 1_500, acquireTimeout: 5_000 });
          late.catch(() => {}); // (ends with the app if an assertion fails)
          assert.ok(
            await eventually(() =>
              monitor.commands.some(
                ({ args }) => args[0] === 'evalsha' && args.includes(`lock:{${key}}`),
              ),
            ),
            'the slow app never asked',
          );
          await sleep(1_700); // its answer comes after its lease
          proxy.heal();
          const lock = await late; // a later attempt, on time
          assert.ok(lock.expiresAt > performance.now());
          assert.equal(await lock.release(), true);
          assert.equal(await slow.locks.isLocked(key), false, 'the late grant was kept');
        },
      );
    });

    it(`${name} granted too late is asked for again only once the give-back is answered: when Redis lost the release script, its EVAL follows the NOSCRIPT (found by mutation testing)`, async () => {
      // A Redis of its own, where the test flushes the scripts: the file's other tests count
      // commands, and would count each script's first NOSCRIPT.
      const own = await startRedis();
      const admin = new Redis(own.port, '127.0.0.1');
      const direct = await startLockModule({ connection: own.url });
      const acquireScript = shape.mode === 'read' ? ACQUIRE_READ_SCRIPT : ACQUIRE_SEMAPHORE_SCRIPT;
      const sha = createHash('sha1').update(acquireScript).digest('hex');
      try {
        await throughProxy(
          { commandTimeout: 3_000, defaults: { retryInterval: 100, retryJitter: 0 } },
          async (proxy, slow, monitor) => {
            const key = uniqueKey();
            const attempts = (): number =>
              monitor.commands.filter(({ args }) => args[0] === 'evalsha' && args[1] === sha)
                .length;
            // A plain lock keeps the slow app's caller out: it subscribes and polls.
            const held = await direct.locks.acquire(key, { ttl: 30_000 });
            const call = slow.locks.acquire(key, { ...shape, ttl: 1_500, acquireTimeout: 8_000 });
            call.catch(() => {}); // (ends with the app if an assertion fails)
            assert.ok(await eventually(() => attempts() >= 2), 'the slow app never waited');
            await sleep(150); // subscribed and polling (its attempt once subscribed has run)
            proxy.holdReplies();
            // Its release's message to the slow app is held with the replies; its next poll is
            // granted, and that answer comes after its 1.5 s lease.
            await held.release();
            const before = attempts();
            assert.ok(await eventually(() => attempts() > before), 'the slow app never polled');
            await sleep(1_700);
            // Redis lost its scripts but the acquisition's: the give-back's EVALSHA is refused,
            // and sent again as EVAL. The held message wakes the caller at once: an attempt
            // that did not wait for the give-back would renew the token's place before that EVAL
            // took it away, and the caller would hold what Redis has not.
            await admin.script('FLUSH');
            await admin.script('LOAD', acquireScript);
            proxy.heal();
            const lock = await call;
            assert.equal(
              await direct.locks.isLocked(key),
              true,
              'the lock granted on time is not in Redis',
            );
            assert.equal(await lock.release(), true);
            assert.equal(await direct.locks.isLocked(key), false);
          },
          own,
        );
      } finally {
        admin.disconnect();
        await direct.close();
        await own.stop();
      }
    });
  }

  it("a caller's own token whose grant came after its lease is not undone: the token may hold the lock already, and keeps it and its fence (found by mutation testing)", async () => {
    await throughProxy(
      { defaults: { retryInterval: 100, retryJitter: 0 } },
      async (proxy, slow, monitor) => {
        await slow.locks.isLocked(uniqueKey()); // connected
        const key = uniqueKey();
        const mine = await holder.acquire(key, { token: 'mine', ttl: 30_000 });
        // The slow app asks with the same token; its grant's answer comes after its 300 ms lease.
        proxy.holdReplies();
        const again = slow.locks.acquire(key, { token: 'mine', ttl: 300, acquireTimeout: 5_000 });
        again.catch(() => {}); // (ends with the app if an assertion fails)
        assert.ok(
          await eventually(() =>
            monitor.commands.some(
              ({ args }) => args[0] === 'evalsha' && args.includes('mine') && args.includes('300'),
            ),
          ),
          'the slow app never asked',
        );
        await sleep(400);
        proxy.heal();
        const lock = await again; // its next attempt, on time
        assert.equal(lock.fence, mine.fence, 'the token lost its fence: its lock was undone');
        await monitor.caughtUp();
        assert.equal(scriptCalls(monitor.commands, RELEASE_SCRIPT, `lock:{${key}}`), 0);
        assert.equal(await redis.get(`lock:{${key}}`), 'mine');
        assert.equal(await mine.release(), true);
      },
    );
  });

  it('a call whose grant came after its lease goes on with a fresh token: the undo, sent again after NOSCRIPT, cannot delete the lock its next attempt gets (found by a helper: two live holders)', async () => {
    const own = await startRedis();
    const proxy = await FaultProxy.start(() => own.port);
    const options = { commandTimeout: 500, defaults: { retryInterval: 5_000 } };
    const slow = await startLockModule({
      ...options,
      connection: `redis://127.0.0.1:${proxy.port}`,
    });
    const others = await Promise.all(
      [0, 1, 2].map(() => startLockModule({ ...options, connection: own.url })),
    );
    const admin = new Redis(own.port, '127.0.0.1');
    const monitor = await monitorRedis(own.port);
    const acquireShas = new Set(
      [ACQUIRE_SCRIPT, ACQUIRE_UNRESERVED_SCRIPT].map((script) =>
        createHash('sha1').update(script).digest('hex'),
      ),
    );
    /** The tokens the acquisitions on `key` asked with, as Redis ran them. */
    const askedWith = async (key: string): Promise<Set<string>> => {
      await monitor.caughtUp();
      return new Set(
        monitor.commands
          .filter(
            ({ args }) =>
              args[3] === `lock:{${key}}` &&
              ((args[0] === 'evalsha' && acquireShas.has(args[1])) ||
                (args[0] === 'eval' &&
                  (args[1] === ACQUIRE_SCRIPT || args[1] === ACQUIRE_UNRESERVED_SCRIPT))),
          )
          .map(({ args }) => args[6]),
      );
    };
    try {
      await slow.locks.isLocked(uniqueKey()); // connected
      // The timing makes the scenario likely, not certain (a loaded machine): it is tried until
      // it happened (the slow call asked with two tokens: its late grant's, then a fresh one).
      let happened = false;
      for (let attempt = 0; attempt < 4 && !happened; attempt++) {
        proxy.setLatency(10);
        const key = uniqueKey();
        const first = await others[0].locks.acquire(key, { ttl: 10_000 });
        const waiting = slow.locks.acquire(key, { ttl: 300, acquireTimeout: 4_000 });
        await sleep(300); // refused, subscribed, asleep (its poll is 5 s away)
        proxy.setLatency(200);
        const released = performance.now();
        await first.release(); // its attempt goes out, and is answered after its 300 ms lease
        await sleep(5);
        const second = await others[1].locks.acquire(key, { ttl: 5_000 });
        await second.release(); // heard on its way: it tries again at once
        // Redis forgets its scripts; another instance loaded the acquisition's again.
        await sleep(500 - (performance.now() - released));
        await admin.script('FLUSH');
        await admin.script('LOAD', ACQUIRE_SCRIPT);
        await sleep(590 - (performance.now() - released));
        proxy.setLatency(10);
        const lock = await waiting;
        const slowTokens = [...(await askedWith(key))].filter(
          (token) => token !== first.token && token !== second.token,
        );
        happened = slowTokens.length >= 2;
        // It holds the key in Redis for as long as its lease runs, and nobody else gets it.
        const stalls = watchStalls();
        while (performance.now() < lock.expiresAt - 20 - stalls.slack() && !lock.signal.aborted) {
          assert.equal(
            await admin.get(`lock:{${key}}`),
            lock.token,
            'the holder’s key was deleted',
          );
          assert.equal(
            await others[2].locks.tryAcquire(key, { ttl: 1_000 }),
            null,
            'two live holders',
          );
          await sleep(10);
        }
        stalls.stop();
        await lock.release();
      }
      assert.ok(happened, 'in 4 tries, no grant of the slow call came after its lease');
    } finally {
      monitor.stop();
      admin.disconnect();
      await slow.close();
      await Promise.all(others.map((app) => app.close()));
      await proxy.close();
      await own.stop();
    }
  });

  it('a caller whose every grant comes after its lease does not keep the key from others: each undo wakes them (found by a helper)', async () => {
    const proxy = await FaultProxy.start(() => server.port);
    const slow = await startLockModule({
      connection: `redis://127.0.0.1:${proxy.port}`,
      commandTimeout: 2_000,
    });
    const fast = await startNonPollingApp({ connection: server.url });
    try {
      await slow.locks.isLocked(uniqueKey()); // connected
      proxy.setLatency(300); // a 600 ms round trip against a 598 ms TTL: every grant too late
      const key = uniqueKey();
      const gone = new AbortController();
      const starved = slow.locks.acquire(key, {
        ttl: 598,
        acquireTimeout: 4_000,
        signal: gone.signal,
      });
      await sleep(700);
      // Woken by a release (it never polls): an undo of the slow caller's late grant.
      const lock = await fast.locks.acquire(key, { ttl: 2_000, acquireTimeout: 3_000 });
      await lock.release();
      gone.abort(new Error('done'));
      await assert.rejects(starved, LockAcquireAbortedError);
    } finally {
      proxy.setLatency(0);
      await slow.close();
      await fast.close();
      await proxy.close();
    }
  });

  it('after a wait, the lock is unsubscribed: no channel stays open', async () => {
    const key = uniqueKey();
    const held = await holder.acquire(key);
    const pending = waiter.acquire(key, { acquireTimeout: 5_000 });
    await queuedIn(waiter, key, 1);
    const probe = new Redis(server.port, '127.0.0.1');
    const during = (await probe.pubsub('CHANNELS', `lock:{${key}}:released`)) as string[];
    await held.release();
    await (await pending).release();
    const channels = async (): Promise<string[]> =>
      (await probe.pubsub('CHANNELS', `lock:{${key}}:released`)) as string[];
    const closed = await eventually(async () => (await channels()).length === 0, 2_000);
    probe.disconnect();
    assert.deepEqual(during, [`lock:{${key}}:released`]);
    assert.ok(closed, 'the channel stayed open');
  });
});
