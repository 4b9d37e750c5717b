import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import { Redis } from 'ioredis';
import {
  LockAcquireAbortedError,
  LockAcquireTimeoutError,
  LockArgumentError,
  RedisLockConfigurationError,
  WithLock,
  type LockService,
} from '../../lib/index.js';
import { ACQUIRE_FAIR_SCRIPT, RELEASE_FAIR_SCRIPT } from '../../lib/redis/fair.scripts.js';
import { FaultProxy } from '../support/fault-proxy.js';
import {
  eventually,
  sleep,
  startLockModule,
  startNonPollingApp,
  uniqueKey,
  waitingCallers,
  type LockModuleFixture,
} from '../support/lock-module.js';
import { assertWithin, watchStalls } from '../support/timing.js';
import { startRedis, type RedisServer } from '../support/redis-server.js';

describe('fair locks (fair: true)', () => {
  let server: RedisServer;
  let apps: LockModuleFixture[];
  let redis: Redis;

  before(async () => {
    server = await startRedis();
    apps = await Promise.all(
      [0, 1, 2].map(() => startLockModule({ connection: server.url, fenceRetention: 0 })),
    );
    redis = new Redis(server.port, '127.0.0.1');
  });
  after(async () => {
    await Promise.all((apps ?? []).map((app) => app.close()));
    redis?.disconnect();
    await server?.stop();
  });

  const fair = { fair: true } as const;
  const locksOf = (i: number): LockService => apps[i].locks;

  it('your own token that holds a fair lock gets its fence again, from any app, and the next holder a greater one; nothing stays', async () => {
    const key = uniqueKey('own');
    const mine = await locksOf(0).acquire(key, { ...fair, token: 'mine', ttl: 10_000 });
    for (const app of [0, 1]) {
      const again = await locksOf(app).acquire(key, { ...fair, token: 'mine', ttl: 10_000 });
      assert.equal(again.fence, mine.fence, `app ${app}: the same fence for the token holding it`);
    }
    assert.equal(await mine.release(), true);
    const next = await locksOf(1).acquire(key, fair);
    assert.ok(next.fence > mine.fence, `${next.fence} after ${mine.fence}`);
    const back = locksOf(0).acquire(key, { ...fair, token: 'mine', acquireTimeout: 5_000 });
    assert.equal(await next.release(), true);
    const mineAgain = await back;
    assert.ok(mineAgain.fence > next.fence, `${mineAgain.fence} after ${next.fence}`);
    assert.equal(await mineAgain.release(), true);
    assert.deepEqual(await redis.keys(`lock:{${key}}*`), []);
  });

  /**
   * Six waiters, alternating between two apps, ask 40 ms apart while a third app holds the key;
   * resolves the order in which they got it.
   */
  async function arrivalRace(fairness: boolean): Promise<number[]> {
    const key = uniqueKey('turns');
    const holder = await locksOf(2).acquire(key);
    const order: number[] = [];
    const waiters: Promise<void>[] = [];
    const queued = async (n: number): Promise<boolean> =>
      (await redis.zcard(`lock:{${key}}:queue`)) === n;
    for (let i = 0; i < 6; i++) {
      waiters.push(
        locksOf(i % 2).using(
          key,
          async () => {
            order.push(i);
            await sleep(15);
          },
          { fair: fairness, acquireTimeout: 10_000 },
        ),
      );
      // A fair waiter has arrived when it is in the queue; the others have no queue to look at.
      if (fairness) assert.ok(await eventually(() => queued(i + 1)), `waiter ${i} queued`);
      else await sleep(40);
    }
    await holder.release();
    await Promise.all(waiters);
    return order;
  }

  it('hands the key to waiters in the order they arrived, across apps (control: without fair it goes round each process first)', async () => {
    assert.deepEqual(await arrivalRace(true), [0, 1, 2, 3, 4, 5]);
    assert.notDeepEqual(await arrivalRace(false), [0, 1, 2, 3, 4, 5]);
  });

  it('a fair caller takes its place in the queue with its first attempt, also while callers of its process wait for the key without fair (found by mutation testing)', async () => {
    const key = uniqueKey('first');
    const holder = await locksOf(2).acquire(key);
    // Its waiters never poll within the test: only its first attempt can queue the fair one.
    const app = await startNonPollingApp({ connection: server.url, fenceRetention: 0 });
    try {
      const plain = app.locks.using(key, () => 'plain', { acquireTimeout: 10_000 });
      assert.ok(await eventually(() => waitingCallers(app.locks, key) === 1), 'never waited');
      const fairOne = app.locks.using(key, () => 'fair', { ...fair, acquireTimeout: 10_000 });
      // (Both end with the app if an assertion fails.)
      for (const call of [plain, fairOne]) call.catch(() => {});
      assert.ok(
        await eventually(async () => (await redis.zcard(`lock:{${key}}:queue`)) === 1),
        'the fair caller never took its place in the queue',
      );
      await holder.release();
      assert.deepEqual(await Promise.all([plain, fairOne]), ['plain', 'fair']);
    } finally {
      await holder.release();
      await app.close();
    }
  });

  /** Queues a waiter that never comes back, whose place lasts `stay` ms (a process that died). */
  const queueGhost = (key: string, token: string, stay: number): Promise<unknown> => {
    const lockKey = `lock:{${key}}`;
    return redis.eval(
      ACQUIRE_FAIR_SCRIPT,
      5,
      lockKey,
      'lock:{}:counter',
      `${lockKey}:queue`,
      `${lockKey}:queue:stay`,
      `${lockKey}:fence`,
      token,
      5_000,
      65_000,
      stay,
      0,
    );
  };

  it('tryAcquire() takes no place in the queue: once the waiters leave, nothing of the queue stays (found by the model suite)', async () => {
    const key = uniqueKey('turns');
    const queue = `lock:{${key}}:queue`;
    const holder = await locksOf(0).acquire(key, fair);
    const controller = new AbortController();
    const waiter = locksOf(1).acquire(key, {
      ...fair,
      acquireTimeout: 10_000,
      signal: controller.signal,
    });
    assert.ok(await eventually(async () => (await redis.zcard(queue)) === 1), 'the waiter queued');
    assert.equal(await locksOf(2).tryAcquire(key, fair), null);
    assert.equal(await redis.zcard(queue), 1, 'tryAcquire() took a place');
    controller.abort();
    await assert.rejects(waiter, LockAcquireAbortedError);
    assert.ok(
      await eventually(async () => (await redis.exists(queue, `${queue}:stay`)) === 0),
      'the queue stayed after its last waiter left',
    );
    await holder.release();
  });

  it('a newcomer cannot barge ahead of the queue while the key is free (control: a caller without fair can)', async () => {
    const key = uniqueKey('turns');
    const holder = await locksOf(0).acquire(key, fair);
    assert.ok(Number(await queueGhost(key, 'head-of-queue', 5_000)) < 0);
    await holder.release();
    assert.equal(await locksOf(0).isLocked(key), false, 'the key is free');
    assert.equal(await locksOf(1).tryAcquire(key, fair), null, 'not the newcomer’s turn');
    await assert.rejects(
      locksOf(2).acquire(key, { ...fair, acquireTimeout: 300 }),
      LockAcquireTimeoutError,
    );
    const barging = (await locksOf(1).tryAcquire(key))!;
    assert.ok(barging, 'fairness binds only the callers that ask for it');
    await barging.release();
    await redis.zrem(`lock:{${key}}:queue`, 'head-of-queue');
    await redis.zrem(`lock:{${key}}:queue:stay`, 'head-of-queue');
    const turn = (await locksOf(1).tryAcquire(key, fair))!;
    assert.ok(turn, 'free and nobody queues: anyone gets it');
    await turn.release();
  });

  it('a waiter that gives up leaves the queue: the next one is not held up', async () => {
    const key = uniqueKey('turns');
    const holder = await locksOf(0).acquire(key, fair);
    const quitter = locksOf(1).acquire(key, { ...fair, acquireTimeout: 200 });
    await sleep(20);
    const patient = locksOf(2).acquire(key, { ...fair, acquireTimeout: 5_000 });
    await assert.rejects(quitter, LockAcquireTimeoutError);
    await sleep(100);
    const watch = watchStalls();
    const releasedAt = performance.now();
    await holder.release();
    const lock = await patient;
    // Woken as the new head at once; behind the quitter's place it would wait out that place's
    // stay: 2 × (retryInterval + retryJitter + commandTimeout), 4.1 s.
    assertWithin(performance.now() - releasedAt, 0, watch, 'the wait after the release');
    watch.stop();
    await lock.release();
  });

  it('a waiter that gives up while its attempt is on the NOSCRIPT detour (lost scripts) leaves the queue after that attempt, not before it', async () => {
    const key = uniqueKey('turns');
    const proxy = await FaultProxy.start(() => server.port);
    const slow = await startLockModule({
      connection: `redis://127.0.0.1:${proxy.port}`,
      fenceRetention: 0,
    });
    try {
      const holder = await locksOf(0).acquire(key, fair);
      // Redis lost its scripts; the give-up's own was loaded again since (another client used it).
      await redis.script('FLUSH');
      await redis.script('LOAD', RELEASE_FAIR_SCRIPT);
      proxy.setLatency(50);
      const controller = new AbortController();
      // Its attempt: EVALSHA, NOSCRIPT 100 ms later, then EVAL; it gives up in between.
      const quitter = slow.locks.acquire(key, {
        ...fair,
        acquireTimeout: 5_000,
        signal: controller.signal,
      });
      setTimeout(() => controller.abort(), 30);
      await assert.rejects(quitter, LockAcquireAbortedError);
      await sleep(400); // the re-sent attempt and the give-up are both answered by now
      const patient = locksOf(1).acquire(key, { ...fair, acquireTimeout: 10_000 });
      await sleep(100);
      const watch = watchStalls();
      const releasedAt = performance.now();
      await holder.release();
      const lock = await patient;
      // Behind a place the re-sent attempt took again after the give-up, it would wait out
      // that place's stay (4.1 s).
      assertWithin(performance.now() - releasedAt, 0, watch, 'the wait after the release');
      watch.stop();
      await lock.release();
    } finally {
      proxy.setLatency(0);
      await slow.close();
      await proxy.close();
    }
  });

  it('a waiter that died stops counting once its stay lapses (the Redis clock), and the next gets the key', async () => {
    const key = uniqueKey('turns');
    const lockKey = `lock:{${key}}`;
    const holder = await locksOf(0).acquire(key, fair);
    // A waiter that queued, then died: its place lasts 300 ms without another attempt.
    assert.ok(Number(await queueGhost(key, 'dead-waiter', 300)) < 0, 'queued behind the holder');
    const alive = locksOf(1).acquire(key, { ...fair, acquireTimeout: 5_000 });
    await sleep(50);
    await holder.release();
    // Behind a place that never lapsed it would time out instead.
    const lock = await alive;
    assert.equal(await redis.zscore(`${lockKey}:queue`, 'dead-waiter'), null);
    await lock.release();
    assert.deepEqual(await redis.keys(`${lockKey}*`), [], 'nothing left (fenceRetention 0)');
  });

  it('a holder that crashed frees the key after its TTL, to the head of the queue', async () => {
    const key = uniqueKey('turns');
    const watch = watchStalls();
    const calledAt = performance.now();
    await locksOf(0).acquire(key, { ...fair, ttl: 400 }); // never released: its process "died"
    const first = locksOf(1).acquire(key, { ...fair, acquireTimeout: 3_000 });
    await sleep(30);
    const second = locksOf(2).acquire(key, { ...fair, acquireTimeout: 3_000 });
    const lock = await first;
    // Redis set the TTL after `calledAt`; the head tries again at the latest a retryInterval
    // (1 s, + 50 ms of jitter) after the key's TTL ran out.
    const after = performance.now() - calledAt;
    assert.ok(after >= 399, `free after ${after.toFixed(0)} ms`);
    assertWithin(after, 400 + 1_050, watch, 'the wait for the crashed holder’s key');
    watch.stop();
    await lock.release();
    await (await second).release();
  });

  it('keeps a TTL on every key it writes, queue included', async () => {
    const key = uniqueKey('turns');
    const holder = await locksOf(0).acquire(key, fair);
    const waiting = locksOf(1).acquire(key, { ...fair, acquireTimeout: 5_000 });
    await sleep(50);
    for (const name of await redis.keys(`lock:{${key}}*`)) {
      assert.ok((await redis.pttl(name)) > 0, `${name} without TTL`);
    }
    await holder.release();
    await (await waiting).release();
  });

  it('bad values and combinations are a LockArgumentError naming them; on @WithLock a RedisLockConfigurationError', async () => {
    const cases: [object, string][] = [
      [{ fair: 'yes' }, 'fair'],
      [{ fair: true, limit: 2 }, 'fair + limit'],
      [{ fair: true, mode: 'read' }, 'fair + mode'],
    ];
    for (const [options, argument] of cases) {
      const error = await locksOf(0)
        .acquire(uniqueKey(), options as never)
        .catch((e: unknown) => e);
      assert.ok(error instanceof LockArgumentError && error.argument === argument, String(error));
    }
    // Re-entry in one call chain must ask for the same shape.
    const key = uniqueKey();
    await locksOf(0).using(
      key,
      async () => {
        await assert.rejects(
          locksOf(0).using(key, () => 1),
          LockArgumentError,
        );
        assert.equal(await locksOf(0).using(key, () => 1, fair), 1);
      },
      fair,
    );
    assert.throws(
      () =>
        WithLock({ key: 'k', fair: 'on' as never })(class Jobs {}.prototype, 'run', {
          value: async () => 1,
        }),
      RedisLockConfigurationError,
    );
  });

  it('a waiter on a client with an ioredis keyPrefix of its own hears its turn (it never polls here)', async () => {
    const clients = [0, 1].map(() => new Redis(server.port, '127.0.0.1', { keyPrefix: 'app:' }));
    const [app, other] = await Promise.all(clients.map((client) => startNonPollingApp({ client })));
    try {
      const key = uniqueKey('prefixed');
      const holder = await other.locks.acquire(key, { ...fair, ttl: 30_000 });
      // Its turn or nothing: the holder's 30 s TTL and the app's 60 s poll are past the deadline
      // (and the holder is in another app: no wake-up within the process). Only its last attempt
      // would come before, at the deadline.
      const waiting = app.locks.acquire(key, { ...fair, acquireTimeout: 20_000 });
      assert.ok(
        await eventually(async () => (await redis.zcard(`app:lock:{${key}}:queue`)) === 1),
        'the waiter never queued',
      );
      // Subscribed to its turn, then (after one more attempt) asleep.
      assert.ok(
        await eventually(
          async () => (await redis.pubsub('CHANNELS', `*{${key}}:fair:*`)).length === 1,
        ),
        'the waiter never listened for its turn',
      );
      await sleep(100);
      const releasedAt = performance.now();
      await holder.release();
      const next = await waiting;
      // Woken, not at its last attempt at the deadline, 20 s on.
      const took = performance.now() - releasedAt;
      assert.ok(took < 10_000, `got its turn ${took.toFixed(0)} ms after the release`);
      assert.ok(next.fence > holder.fence);
      await next.release();
    } finally {
      await Promise.all([app.close(), other.close()]);
      for (const client of clients) client.disconnect();
    }
  });
});
