/**
 * `nestjs-redis-lock/testing`: `RedisLockTestingModule` gives a user's `Test.createTestingModule`
 * the same `LockService`, `@WithLock` and `@WhileLeader` without a Redis. No redis-server here:
 * what it keeps is in memory. (The model-based suite runs its sequences against it too:
 * model-memory.spec.)
 */
import assert from 'node:assert/strict';
import { after, afterEach, describe, it } from 'node:test';
import { Injectable, Module } from '@nestjs/common';
import { Test, type TestingModule } from '@nestjs/testing';
import {
  LockAcquireTimeoutError,
  LockLostError,
  LockService,
  RedisLockConfigurationError,
  RedisLockModule,
  WhileLeader,
  WithLock,
  type LeaderTerm,
  type Lock,
} from '../../lib/index.js';
import {
  InMemoryLockStore,
  RedisLockTestingModule,
  type RedisLockTestingOptions,
} from '../../lib/testing/index.js';

const sleep = (ms: number): Promise<void> => new Promise((resolve) => setTimeout(resolve, ms));

/** A user's service, as the README's recipe has it. */
@Injectable()
class OrdersService {
  running = 0;
  mostAtOnce = 0;
  readonly fences: number[] = [];

  @WithLock({ key: 'order:{0}', ttl: 1_000 })
  async pay(id: string, ms: number): Promise<string> {
    this.mostAtOnce = Math.max(this.mostAtOnce, ++this.running);
    await sleep(ms);
    this.running--;
    return `paid ${id}`;
  }

  @WithLock({ key: 'report', onBusy: 'skip', holdAtLeast: 200 })
  async report(): Promise<'ran'> {
    return 'ran';
  }
}

/** A worker that runs on one app of those sharing a store. */
@Injectable()
class Worker {
  readonly terms: number[] = [];

  @WhileLeader('worker', { ttl: 300 })
  async work({ fence, signal }: LeaderTerm): Promise<void> {
    this.terms.push(fence);
    await new Promise((resolve) => signal.addEventListener('abort', resolve, { once: true }));
  }
}

/** An app whose first waiter never polls within a test (see `startNonPollingApp`). */
const NON_POLLING = { defaults: { retryInterval: 60_000 } };

const opened: TestingModule[] = [];
async function start(
  options: RedisLockTestingOptions = {},
  providers: (typeof OrdersService | typeof Worker)[] = [OrdersService],
): Promise<TestingModule> {
  const module = await Test.createTestingModule({
    imports: [RedisLockTestingModule.forRoot(options)],
    providers,
  }).compile();
  opened.push(module);
  await module.init();
  return module;
}
afterEach(async () => {
  await Promise.all(opened.splice(0).map((module) => module.close()));
});

describe('RedisLockTestingModule', () => {
  it("runs a user's @WithLock service in Test.createTestingModule: one call at a time per key", async () => {
    const orders = (await start()).get(OrdersService);
    const paid = await Promise.all([
      orders.pay('1', 30),
      orders.pay('1', 30),
      orders.pay('1', 30),
      orders.pay('2', 30),
    ]);
    assert.deepEqual(paid, ['paid 1', 'paid 1', 'paid 1', 'paid 2']);
    assert.equal(orders.mostAtOnce, 2, 'order 2 beside order 1, never two of order 1');
  });

  it("onBusy 'skip' and holdAtLeast: a second fire within holdAtLeast is skipped", async () => {
    const orders = (await start()).get(OrdersService);
    assert.equal(await orders.report(), 'ran');
    assert.equal(await orders.report(), undefined);
    await sleep(250);
    assert.equal(await orders.report(), 'ran');
  });

  it('gives fences that grow on each key, from 1, and keeps an own token its fence', async () => {
    const locks = (await start()).get(LockService);
    const fences: number[] = [];
    for (let i = 0; i < 3; i++) await locks.using('k', (lock) => void fences.push(lock.fence));
    assert.deepEqual(fences, [1, 2, 3]);
    const own = await locks.acquire('mine', { token: 'tok-1' });
    const again = await locks.acquire('mine', { token: 'tok-1' });
    assert.equal(again.fence, own.fence);
    assert.equal((await locks.inspect('mine')).fence, own.fence);
    await own.release();
  });

  it('times leases as Redis does: an unextended lock runs out after its TTL, and its signal aborts', async () => {
    const locks = (await start()).get(LockService);
    const lock = await locks.acquire('ttl', { ttl: 100 });
    assert.equal(await locks.tryAcquire('ttl'), null);
    await sleep(150);
    assert.ok(lock.signal.aborted);
    assert.ok(lock.signal.reason instanceof LockLostError);
    const next = await locks.tryAcquire('ttl');
    assert.ok(next);
    assert.equal(await lock.release(), false);
    await next.release();
  });

  it('auto-extends a using() section beyond its TTL', async () => {
    const locks = (await start()).get(LockService);
    await locks.using(
      'long',
      async (lock) => {
        await sleep(1_000);
        assert.ok(!lock.signal.aborted);
        // (Not tryAcquire here: this call chain holds the key, so it would re-enter it.)
        assert.equal((await locks.inspect('long')).holders, 1);
      },
      // (Extended every 200 ms: an event loop stalled 400 ms would lose it, as on Redis.)
      { ttl: 600 },
    );
    assert.equal(await locks.isLocked('long'), false);
  });

  it('re-enters a key held higher up the call chain instead of deadlocking', async () => {
    const locks = (await start()).get(LockService);
    await locks.using('outer', (outer) =>
      locks.using('outer', (inner) => assert.equal(inner.fence, outer.fence)),
    );
  });

  it('waits, and times out with LockAcquireTimeoutError', async () => {
    const locks = (await start()).get(LockService);
    const held = await locks.acquire('busy', { ttl: 5_000 });
    await assert.rejects(
      locks.acquire('busy', { acquireTimeout: 50 }),
      (error: unknown) => error instanceof LockAcquireTimeoutError && error.key === 'busy',
    );
    const waiter = locks.acquire('busy', { acquireTimeout: 2_000 });
    await sleep(20);
    await held.release();
    await (await waiter).release();
  });

  it('serves a key in order of arrival within the app', async () => {
    const locks = (await start()).get(LockService);
    const first = await locks.acquire('queue');
    const order: number[] = [];
    const waiters = [0, 1, 2, 3].map((i) =>
      locks.using('queue', () => void order.push(i), { acquireTimeout: 2_000 }),
    );
    await sleep(20);
    await first.release();
    await Promise.all(waiters);
    assert.deepEqual(order, [0, 1, 2, 3]);
  });

  it('offers every shape: a semaphore, read and write locks, a fair lock', async () => {
    const locks = (await start()).get(LockService);
    const places = await Promise.all([1, 2, 3].map(() => locks.tryAcquire('sem', { limit: 2 })));
    assert.equal(places.filter(Boolean).length, 2);
    const inspected = await locks.inspect('sem');
    assert.equal(inspected.mode, 'semaphore');
    assert.equal(inspected.holders, 2);
    for (const place of places) await place?.release();

    const readers = await Promise.all([1, 2].map(() => locks.acquire('doc', { mode: 'read' })));
    assert.equal(await locks.tryAcquire('doc', { mode: 'write' }), null);
    const writer = locks.acquire('doc', { mode: 'write', acquireTimeout: 2_000 });
    await sleep(20);
    assert.equal(
      await locks.tryAcquire('doc', { mode: 'read' }),
      null,
      'a waiting writer holds new readers off',
    );
    for (const reader of readers) await reader.release();
    await (await writer).release();

    const head = await locks.acquire('fair', { fair: true });
    const order: number[] = [];
    const fair = [0, 1, 2].map((i) =>
      locks.using('fair', () => void order.push(i), { fair: true, acquireTimeout: 2_000 }),
    );
    await sleep(20);
    assert.equal(
      await locks.tryAcquire('fair', { fair: true }),
      null,
      'no newcomer ahead of the queue',
    );
    await head.release();
    await Promise.all(fair);
    assert.deepEqual(order, [0, 1, 2]);
  });

  it('locks several keys all or none', async () => {
    const locks = (await start()).get(LockService);
    const b = await locks.acquire('b');
    assert.equal(await locks.tryAcquire(['a', 'b']), null);
    assert.equal(await locks.isLocked('a'), false, 'nothing kept of a failed attempt');
    await b.release();
    const both = await locks.acquire(['a', 'b']);
    assert.deepEqual(Object.keys(both.fences).sort(), ['a', 'b']);
    await both.release();
  });

  it('inspects and force-releases: the holder is told at once', async () => {
    const locks = (await start()).get(LockService);
    const lock: Lock = await locks.acquire('stuck', { ttl: 5_000 });
    const forced = await locks.forceRelease('stuck', { reason: 'test' });
    assert.equal(forced.holders, 1);
    assert.ok(forced.fence > lock.fence);
    assert.ok(lock.signal.aborted);
    assert.equal((await locks.inspect('stuck')).held, false);
  });

  it("a force in the same tick as the app's own acquire of the key tells that holder too", async () => {
    const locks = (await start()).get(LockService);
    for (const options of [{}, { mode: 'read' as const }, { limit: 2 }, { fair: true }]) {
      const key = `race:${JSON.stringify(options)}`;
      const acquiring = locks.acquire(key, { ttl: 5_000, ...options });
      await locks.forceRelease(key, { reason: 'test' });
      const lock = await acquiring;
      assert.ok(lock.signal.aborted, `${key}: the holder freed by the force is told at once`);
    }
  });

  it('apps sharing a store contend as instances on one Redis do; apps with their own do not', async () => {
    const store = new InMemoryLockStore();
    // The other app never polls within the test (its next try would be 30 s away, at the holder's
    // TTL): a wait that ends in the lock was ended by the release.
    const apps = [await start({ store }), await start({ store, ...NON_POLLING })];
    const [a, b] = apps.map((m) => m.get(LockService));
    const held = await a.acquire('shared', { ttl: 30_000 });
    assert.equal(await b.tryAcquire('shared'), null);
    const waiting = b.acquire('shared', { acquireTimeout: 20_000, ttl: 5_000 });
    await sleep(20);
    await held.release();
    const got = await waiting;
    assert.ok(got.fence > held.fence);
    await got.release();
    const alone = (await start()).get(LockService);
    const mine = await alone.acquire('shared');
    await mine.release();
  });

  it('an app passes a hot lock among its own callers for handoffTurn only, then yields it to the other apps', async () => {
    const store = new InMemoryLockStore();
    // The other app never polls within the test: it gets the key only if the busy app yields it
    // (kept among its own callers, the key is never free for it to find).
    const apps = [await start({ store }), await start({ store, ...NON_POLLING })];
    const [a, b] = apps.map((m) => m.get(LockService));
    let stop = false;
    const worker = async (): Promise<void> => {
      while (!stop) await a.using('hot', () => sleep(5));
    };
    const workers = [worker(), worker(), worker()];
    await sleep(30);
    try {
      assert.equal(await b.using('hot', () => 'ran', { acquireTimeout: 10_000 }), 'ran');
    } finally {
      stop = true;
      await Promise.all(workers);
    }
  });

  it('with handoffTurn 0, apps sharing a store take turns, as on Redis', async () => {
    const store = new InMemoryLockStore();
    const apps = [await start({ store, handoffTurn: 0 }), await start({ store, handoffTurn: 0 })];
    const [a, b] = apps.map((m) => m.get(LockService));
    const held = await a.acquire('turns', { ttl: 5_000 });
    const order: string[] = [];
    const callers = ['a1', 'b1', 'a2', 'b2', 'a3', 'b3'].map(async (name, i) => {
      await sleep(i * 5);
      const lock = await (name.startsWith('a') ? a : b).acquire('turns', { acquireTimeout: 4_000 });
      order.push(name);
      await sleep(10);
      await lock.release();
    });
    await sleep(50);
    await held.release();
    await Promise.all(callers);
    assert.deepEqual(order, ['b1', 'a1', 'b2', 'a2', 'b3', 'a3']);
  });

  it('answers whole milliseconds where Redis does: ttlLeft, retryAfterMs', async () => {
    const locks = (await start()).get(LockService);
    const lock = await locks.acquire('ms', { ttl: 1_000 });
    const { ttlLeft } = await locks.inspect('ms');
    const refused = await locks
      .acquire('ms', { acquireTimeout: 0 })
      .catch((error: unknown) => error);
    assert.ok(Number.isInteger(ttlLeft) && ttlLeft <= 1_000, String(ttlLeft));
    assert.ok(refused instanceof LockAcquireTimeoutError);
    assert.ok(Number.isInteger(refused.retryAfterMs), String(refused.retryAfterMs));
    await lock.release();
  });

  it('elects one leader among apps sharing a store; the next takes over when it stops', async () => {
    const store = new InMemoryLockStore();
    const apps = [await start({ store }, [Worker]), await start({ store }, [Worker])];
    const workers = apps.map((app) => app.get(Worker));
    const locks = apps.map((app) => app.get(LockService));
    await sleep(50);
    const leading = workers.map((worker) => worker.terms.length);
    assert.deepEqual(leading.sort(), [0, 1], 'exactly one app leads');
    const leaderApp = workers[0].terms.length === 1 ? 0 : 1;
    const info = await locks[0].leader('worker');
    assert.equal(info?.id, locks[leaderApp].leadership('worker')?.id);
    assert.equal((await locks[1].participants('worker')).length, 2);
    await locks[leaderApp].leadership('worker')?.stop();
    const next = await locks[1 - leaderApp].leadership('worker')!.elected({ timeout: 1_000 });
    assert.ok(next.fence > workers[leaderApp].terms[0]);
  });

  it('refuses the options of a Redis, and a store that is not an InMemoryLockStore', async () => {
    await assert.rejects(
      start({ connection: 'redis://127.0.0.1:6379' } as RedisLockTestingOptions),
      (error: unknown) =>
        error instanceof RedisLockConfigurationError &&
        /keeps its locks in memory/.test(error.message),
    );
    assert.throws(
      () => RedisLockTestingModule.forRoot({ store: {} as InMemoryLockStore }),
      RedisLockConfigurationError,
    );
  });

  it("replaces an AppModule's RedisLockModule with overrideModule, as the guide's recipe does", async () => {
    // A Redis nobody listens on: if the real module were built, its first lock would fail.
    const lockModule = RedisLockModule.forRoot({
      connection: 'redis://127.0.0.1:1',
      isGlobal: true,
      commandTimeout: 200,
    });
    @Module({ imports: [lockModule], providers: [OrdersService] })
    class AppModule {}
    const module = await Test.createTestingModule({ imports: [AppModule] })
      .overrideModule(lockModule)
      .useModule(RedisLockTestingModule.forRoot({ isGlobal: true }))
      .compile();
    opened.push(module);
    await module.init();
    assert.equal(await module.get(OrdersService).pay('7', 1), 'paid 7');
    assert.equal((await module.get(LockService).checkHealth()).up, true);
  });

  it('a release of a lock that ran out frees nothing of the next holder', async () => {
    const locks = (await start()).get(LockService);
    const lapsed = await locks.acquire('lapse', { ttl: 50 });
    await sleep(80);
    const next = await locks.acquire('lapse', { ttl: 5_000 });
    assert.equal(await lapsed.release(), false);
    assert.equal((await locks.inspect('lapse')).holders, 1);
    assert.equal(await next.release(), true);
  });

  it('is global with isGlobal, as RedisLockModule is', async () => {
    @Injectable()
    class Feature {
      constructor(readonly locks: LockService) {}
    }
    @Module({ providers: [Feature], exports: [Feature] })
    class FeatureModule {}
    const module = await Test.createTestingModule({
      imports: [RedisLockTestingModule.forRoot({ isGlobal: true }), FeatureModule],
    }).compile();
    opened.push(module);
    assert.ok(module.get(Feature).locks instanceof LockService);
  });
});

after(() => {
  assert.equal(opened.length, 0);
});
