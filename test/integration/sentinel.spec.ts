import assert from 'node:assert/strict';
import { after, afterEach, before, describe, it } from 'node:test';
import { inspect } from 'node:util';
import { Redis } from 'ioredis';
import { LockBackendError } from '../../lib/index.js';
import {
  eventually,
  LogCapture,
  sleep,
  startLockModule,
  startNonPollingApp,
  uniqueKey,
  waitingCallers,
  type LockModuleFixture,
} from '../support/lock-module.js';
import { raceThenLock } from '../support/processes.js';
import {
  startRedis,
  startSentinel,
  startSentinelGroup,
  type RedisServer,
  type SentinelGroup,
} from '../support/redis-server.js';
import { assertWithin, watchStalls } from '../support/timing.js';

/** What the race test reaches into: the module's connections, and ioredis' connector of each. */
interface Internals {
  client: Redis;
  notifier: { subscribers?: Redis[] };
}
type WithConnector = { connector: { disconnect(): void } };

describe('through Sentinel', () => {
  let master: RedisServer;
  let sentinel: RedisServer;
  let app: LockModuleFixture;
  let other: LockModuleFixture;
  let connection: { sentinels: { host: string; port: number }[]; name: string };

  before(async () => {
    master = await startRedis();
    sentinel = await startSentinel(master);
    connection = {
      sentinels: [{ host: sentinel.host, port: sentinel.port }],
      name: 'mymaster',
    };
    app = await startLockModule({ connection });
    // Its waiters never poll within a test: a wait that ends in a lock was ended by a release.
    other = await startNonPollingApp({ connection });
  });
  after(async () => {
    await app?.close();
    await other?.close();
    await sentinel?.stop();
    await master?.stop();
  });

  it('locks on the master that Sentinel names, and wakes waiters on release', async () => {
    const key = uniqueKey();
    const lock = await app.locks.acquire(key);
    const direct = new Redis(master.port, master.host);
    try {
      assert.equal(await direct.get(`lock:{${key}}`), lock.token);
    } finally {
      direct.disconnect();
    }
    const waiting = other.locks.acquire(key, { acquireTimeout: 5_000 });
    assert.ok(await eventually(() => waitingCallers(other.locks, key) === 1), 'it waits');
    await lock.release();
    const next = await waiting; // woken by the release: its next poll is 60 s away
    assert.ok(next.fence > lock.fence);
    await next.release();
  });

  it('comes back from the ioredis race that ends a Sentinel connection for good, on the command and the subscriber connection', async () => {
    const key = uniqueKey();
    const channel = `lock:{${key}}:released`;
    const held = await other.locks.acquire(key);
    // A waiter that never polls meanwhile: a poll sent while the test cuts the command connection
    // fails (ioredis fails what it queued when it ends the connection), its call rejects with
    // LockBackendError, as documented, and its channel is given up, so there is nothing left to
    // subscribe to again (a gate run: "the subscriber did not subscribe again (its status: ready").
    const racer = await startNonPollingApp({ connection });
    const waiting = racer.locks.acquire(key, { acquireTimeout: 10_000 });
    let settled = 'not settled';
    waiting.then(
      () => (settled = 'acquired'),
      (error: unknown) => (settled = `rejected: ${String(error)}`),
    );
    const direct = new Redis(master.port, master.host);
    const subscribed = async (): Promise<boolean> =>
      ((await direct.pubsub('NUMSUB', channel)) as [string, number])[1] === 1;
    const { backend } = (racer.locks as unknown as { engine: { backend: Internals } }).engine;
    const { capture, restore } = LogCapture.install();
    try {
      assert.ok(await eventually(subscribed));
      const connections = [backend.client, backend.notifier.subscribers![0]];
      for (const connection of connections) {
        // What ioredis' failover detector does on `+switch-master` (`connector.disconnect()`),
        // done while a reconnection attempt asks the Sentinel where the master is: ioredis then
        // ends the connection (status `end`, never left by itself; every command fails at once).
        const attempting = new Promise((resolve) => connection.once('connecting', resolve));
        connection.disconnect(true);
        await attempting;
        const ended = new Promise((resolve) => connection.once('end', resolve));
        (connection as unknown as WithConnector).connector.disconnect();
        await ended;
        assert.ok(
          await eventually(() => connection.status === 'ready'),
          `the connection stayed ${connection.status}`,
        );
      }
      const warned = capture.lines.filter(
        ({ level, message }) => level === 'warn' && message.includes('ended by ioredis'),
      );
      assert.equal(warned.length, 2, JSON.stringify(capture.lines));
      // The command connection works again, and the subscriber subscribed again.
      assert.ok(await racer.locks.tryAcquire(uniqueKey()).then((lock) => lock?.release()));
      // If this fails again, say in what state the subscriber and the waiter were, and what the
      // module logged.
      assert.ok(
        await eventually(subscribed),
        `the subscriber did not subscribe again (its status: ${connections[1].status}; the waiter: ${settled}; logged: ${JSON.stringify(capture.lines.slice(-6))})`,
      );
      await held.release();
      await (await waiting).release();
    } finally {
      restore();
      direct.disconnect();
      await racer.close();
    }
  });

  it('control: 3 processes incrementing without the lock lose updates; under it the count is exact', async () => {
    const target = `sentinel:${sentinel.port}`;
    const direct = new Redis(master.port, master.host);
    const read = (counter: string): Promise<string | null> => direct.get(counter);
    try {
      // One start of the processes: first the control without the lock, then under it.
      const { raced, locked } = await raceThenLock(target, 3, 300, 25, read);
      assert.ok(raced < 900, `the control lost no update: ${raced}`);
      assert.equal(locked, 75, `lost updates under the lock: ${locked} of 75`);
    } finally {
      direct.disconnect();
    }
  });
});

describe('through Sentinel, failing over (a master, a replica, 3 Sentinels)', () => {
  let group: SentinelGroup | undefined;
  let app: LockModuleFixture | undefined;

  afterEach(async () => {
    await app?.close();
    await group?.stop();
    app = group = undefined;
  });

  async function start(): Promise<[SentinelGroup, LockModuleFixture]> {
    group = await startSentinelGroup();
    app = await startLockModule({
      connection: {
        sentinels: group.sentinels.map(({ host, port }) => ({ host, port })),
        name: group.name,
      },
    });
    return [group, app];
  }

  /**
   * Once Sentinel names the new master, tries a fresh key every 20 ms until a lock is taken and
   * found on the server at `port`; resolves the ms since `since`.
   */
  async function lockingResumedOn(
    group: SentinelGroup,
    app: LockModuleFixture,
    port: number,
    since: number,
  ): Promise<number> {
    const promoted = new Redis(port, '127.0.0.1').on('error', () => {});
    try {
      await group.switchedTo(port, since);
      // Bounded, as the cluster spec's: a test never waits without a bound.
      let last = 'no attempt';
      while (performance.now() - since < 20_000) {
        const key = uniqueKey();
        const lock = await app.locks.tryAcquire(key).then(
          (taken) => {
            last = taken ? `a lock taken, but not found on port ${port}` : 'busy';
            return taken;
          },
          (error: Error) => {
            last = `${error.name}: ${error.message}`;
            return null;
          },
        );
        const there = lock && (await promoted.get(`lock:{${key}}`)) === lock.token;
        await lock?.release().catch(() => false);
        if (there) return performance.now() - since;
        await sleep(20);
      }
      assert.fail(
        `locking did not resume on the promoted master (port ${port}) within 20 s; last attempt: ${last}; Sentinel names port ${await group.masterPort()}`,
      );
    } finally {
      promoted.disconnect();
    }
  }

  for (const how of ['SENTINEL FAILOVER', 'a killed master'] as const) {
    it(`locking resumes on the promoted master soon after ${how}`, async (t) => {
      const [group, app] = await start();
      const heldKey = uniqueKey();
      const held = await app.locks.acquire(heldKey, { ttl: 30_000 });
      // Replication is asynchronous: wait until the replica has the lock (see replicaAck).
      const replica = new Redis(group.replica.port, '127.0.0.1');
      assert.ok(
        await eventually(async () => (await replica.get(`lock:{${heldKey}}`)) === held.token),
      );
      replica.disconnect();
      const watch = watchStalls();
      const started = performance.now();
      if (how === 'SENTINEL FAILOVER') {
        const sentinel = new Redis(group.sentinels[0].port, '127.0.0.1');
        await sentinel.call('SENTINEL', 'FAILOVER', group.name);
        sentinel.disconnect();
      } else {
        const dead = group.master.port;
        await group.master.kill();
        // While Sentinel still names the dead master, a call fails at once with
        // LockBackendError, at the connection's next failed reconnection (250 ms apart at most),
        // not after commandTimeout (1 s): nothing queues for a master that is gone.
        let failed = 0;
        while (failed < 3 && (await group.masterPort()) === dead) {
          const callWatch = watchStalls();
          const asked = performance.now();
          const outcome = await app.locks.tryAcquire(uniqueKey()).then(
            (lock) => lock,
            (error: unknown) => error,
          );
          const took = performance.now() - asked;
          callWatch.stop();
          if ((await group.masterPort()) !== dead) break; // switched meanwhile: not this case
          assert.ok(outcome instanceof LockBackendError, inspect(outcome));
          assertWithin(took, 250, callWatch, 'a call with no master reachable');
          failed++;
        }
        assert.ok(failed > 0, 'Sentinel switched before a call could meet the dead master');
      }
      const [switched, resumed] = await Promise.all([
        group.switchedTo(group.replica.port, started),
        lockingResumedOn(group, app, group.replica.port, started),
      ]);
      t.diagnostic(
        `${how}: Sentinel switched after ${switched.toFixed(0)} ms, locks taken on the new master after ${resumed.toFixed(0)} ms`,
      );
      // Within a quarter second of the switch on an idle machine (reconnecting every 250 ms at
      // most, see SENTINEL_DEFAULTS).
      assertWithin(resumed - switched, 300, watch, `locking again after ${how}`);
      watch.stop();
      // The lock held across the failover was replicated: it can be extended and released.
      await held.extend();
      assert.equal(await held.release(), true);
    });
  }
});
