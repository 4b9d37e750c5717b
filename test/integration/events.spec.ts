import assert from 'node:assert/strict';
import { once } from 'node:events';
import { after, before, describe, it } from 'node:test';
import { config, filter, firstValueFrom, toArray, type Subscription } from 'rxjs';
import { LockAcquireTimeoutError, type LockEvent } from '../../lib/index.js';
import { LockEvents } from '../../lib/engine/lock.events.js';
import {
  eventually,
  sleep,
  startLockModule,
  uniqueKey,
  type LockModuleFixture,
} from '../support/lock-module.js';
import { startRedis, type RedisServer } from '../support/redis-server.js';
import { assertWithin, watchStalls } from '../support/timing.js';

describe('LockService.events', () => {
  let server: RedisServer;
  let app: LockModuleFixture;
  let other: LockModuleFixture;

  before(async () => {
    server = await startRedis();
    app = await startLockModule({ connection: server.url });
    other = await startLockModule({ connection: server.url });
  });
  after(async () => {
    await app?.close();
    await other?.close();
    await server?.stop();
  });

  /** Collects the events of `key` while `fn` runs. */
  async function eventsOf(key: string, fn: () => Promise<unknown>): Promise<LockEvent[]> {
    const seen: LockEvent[] = [];
    const subscription = app.locks.events.subscribe((event) => {
      if (event.key === key) seen.push(event);
    });
    try {
      await fn();
    } finally {
      subscription.unsubscribe();
    }
    return seen;
  }

  it('reports acquired, extended and released for using(), with fence and times, never the token', async () => {
    const key = uniqueKey();
    let token = '';
    let fence = 0;
    const events = await eventsOf(key, () =>
      app.locks.using(
        key,
        async (lock) => {
          ({ token, fence } = lock);
          await sleep(700); // the watchdog extends a 1 s lease at least once (at a third of it)
        },
        { ttl: 1_000 },
      ),
    );
    const types = events.map((event) => event.type);
    assert.equal(types[0], 'acquired');
    assert.ok(types.includes('extended'));
    assert.equal(types.at(-1), 'released');
    for (const event of events) assert.equal('fence' in event && event.fence, fence);
    const released = events.at(-1) as Extract<LockEvent, { type: 'released' }>;
    assert.ok(released.heldMs >= 690, `held ${released.heldMs}`);
    assert.equal(released.shutdown, false);
    assert.ok(!JSON.stringify(events).includes(token), 'no token in any event');
  });

  it('reports waitedMs on acquisition, and a timeout from acquire() and tryAcquire()', async () => {
    const key = uniqueKey();
    const held = await other.locks.acquire(key);
    const watch = watchStalls();
    const events = await eventsOf(key, async () => {
      await assert.rejects(
        app.locks.acquire(key, { acquireTimeout: 100 }),
        LockAcquireTimeoutError,
      );
      assert.equal(await app.locks.tryAcquire(key), null);
      setTimeout(() => void held.release(), 100);
      const lock = await app.locks.acquire(key, { acquireTimeout: 2_000 });
      await lock.release();
    });
    assert.deepEqual(
      events.map((event) => event.type),
      ['timeout', 'timeout', 'acquired', 'released'],
    );
    const [waited, tried, acquired] = events as [
      Extract<LockEvent, { type: 'timeout' }>,
      Extract<LockEvent, { type: 'timeout' }>,
      Extract<LockEvent, { type: 'acquired' }>,
    ];
    assert.ok(waited.waitedMs >= 100, `${waited.waitedMs}`);
    // tryAcquire() makes one attempt and never waits: one round trip to a healthy Redis.
    assertWithin(tried.waitedMs, 0, watch, "tryAcquire()'s one attempt");
    assert.ok(acquired.waitedMs >= 90, `${acquired.waitedMs}`);
    watch.stop();
  });

  it('reports a lost lock with its reason, once (its release after is no event), and one acquisition for a re-entered lock', async () => {
    const key = uniqueKey();
    const started = performance.now();
    const events = await eventsOf(key, async () => {
      const lock = await app.locks.acquire(key, { ttl: 100 });
      await once(lock.signal, 'abort');
      // (The lease ends a little before Redis lets the key go: the release once it has.)
      assert.ok(await eventually(async () => !(await other.locks.isLocked(key)), 2_000));
      assert.equal(await lock.release(), false);
      await app.locks.using(key, () => app.locks.using(key, () => sleep(1)));
    });
    const lost = events[1] as Extract<LockEvent, { type: 'lost' }>;
    assert.deepEqual(
      events.map((event) => event.type),
      ['acquired', 'lost', 'acquired', 'released'],
    );
    assert.equal(lost.reason, 'expired');
    assert.ok(lost.heldMs >= 95);
    assert.ok(lost.heldMs <= performance.now() - started, `held ${lost.heldMs}`);
  });

  it('a throwing or slow subscriber never breaks locking', async () => {
    const thrown: unknown[] = [];
    const original = config.onUnhandledError;
    config.onUnhandledError = (error) => thrown.push(error);
    const subscriptions: Subscription[] = [
      app.locks.events.subscribe(() => {
        throw new Error('subscriber bug');
      }),
      app.locks.events.subscribe(() => void sleep(1_000)), // slow, asynchronously
    ];
    try {
      const key = uniqueKey();
      const watch = watchStalls();
      const started = performance.now();
      for (let i = 0; i < 5; i++) await app.locks.using(key, () => sleep(1));
      // Were the slow subscriber waited for, 5 locks would take 5 s at least (10 events of 1 s);
      // 5 sections of 1 ms and their 10 round trips take a few ms.
      assertWithin(
        performance.now() - started,
        100,
        watch,
        'five sections beside a slow subscriber',
      );
      watch.stop();
      assert.ok(await eventually(() => thrown.length === 10));
    } finally {
      for (const subscription of subscriptions) subscription.unsubscribe();
      config.onUnhandledError = original;
    }
  });

  it('an event a subscriber causes while it hears another reaches every subscriber after that one (found by a review)', async () => {
    const [a, b] = [uniqueKey('a'), uniqueKey('b')];
    const other = await app.locks.acquire(b);
    const first: string[] = [];
    const second: string[] = [];
    const releasing = app.locks.events.subscribe((event) => {
      first.push(`${event.type} ${event.key}`);
      // release() emits its event at once, while this one is still being delivered.
      if (event.type === 'acquired' && event.key === a) void other.release();
    });
    const listening = app.locks.events.subscribe((event) => {
      second.push(`${event.type} ${event.key}`);
    });
    try {
      const lock = await app.locks.acquire(a);
      await lock.release();
    } finally {
      releasing.unsubscribe();
      listening.unsubscribe();
    }
    const order = [`acquired ${a}`, `released ${b}`, `released ${a}`];
    assert.deepEqual(first, order);
    assert.deepEqual(second, order);
  });

  it('costs nothing while nobody subscribes: no event is even built', async () => {
    const built: string[] = [];
    const emit = LockEvents.prototype.emit;
    LockEvents.prototype.emit = function (this: LockEvents, event: LockEvent) {
      built.push(event.type);
      emit.call(this, event);
    };
    try {
      const key = uniqueKey();
      await app.locks.using(key, () => sleep(1));
      const lock = await app.locks.tryAcquire(key);
      await lock?.extend();
      assert.equal(await lock?.release(), true);
      const lost = await app.locks.acquire(key, { ttl: 50 });
      await once(lost.signal, 'abort');
      assert.deepEqual(built, []);
      const subscription = app.locks.events.subscribe();
      await app.locks.using(key, () => sleep(1));
      subscription.unsubscribe();
      await app.locks.using(key, () => sleep(1));
      assert.deepEqual(built, ['acquired', 'released']);
    } finally {
      LockEvents.prototype.emit = emit;
    }
  });

  it('reports the locks released on shutdown, then completes', async () => {
    const fixture = await startLockModule({ connection: server.url });
    const all = firstValueFrom(
      fixture.locks.events.pipe(
        filter((e) => e.type !== 'acquired'),
        toArray(),
      ),
    );
    const lock = await fixture.locks.acquire(uniqueKey());
    const { signal } = lock;
    await fixture.close();
    const events = await all;
    // One event: the release, not a `lost` too, though the signal aborts with reason 'shutdown'.
    assert.equal(events.length, 1);
    assert.equal((signal.reason as { reason?: string }).reason, 'shutdown');
    assert.deepEqual(
      { type: events[0].type, shutdown: (events[0] as { shutdown?: boolean }).shutdown },
      { type: 'released', shutdown: true },
    );
  });
});
