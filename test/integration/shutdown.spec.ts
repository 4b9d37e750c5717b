import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import { Redis } from 'ioredis';
import { RedisLockShutdownError, type LockService } from '../../lib/index.js';
import { FaultProxy } from '../support/fault-proxy.js';
import { eventually, sleep, startLockModule, uniqueKey } from '../support/lock-module.js';
import { startRedis, type RedisServer } from '../support/redis-server.js';
import { assertWithin, watchStalls } from '../support/timing.js';

/**
 * Shutdown meets the engine mid-flight: a hand-over through Redis to a waiter the shutdown
 * rejects, scripts Redis lost, a paused Redis with an attempt and a leader's release in flight.
 * Whatever was sent is waited for within one deadline, and nothing is left in Redis.
 */
describe('shutdown while locks are on their way', () => {
  let server: RedisServer;
  let redis: Redis;

  before(async () => {
    server = await startRedis();
    redis = new Redis(server.port, '127.0.0.1');
  });
  after(async () => {
    redis?.disconnect();
    await server?.stop();
  });

  /** Until `locks`' waiter on `key` is queued behind the holder (subscribed, and tried again). */
  const queued = async (key: string): Promise<void> => {
    const channel = `lock:{${key}}:released`;
    const count = async (): Promise<number> =>
      Number(((await redis.pubsub('NUMSUB', channel)) as [string, number])[1]);
    assert.ok(await eventually(async () => (await count()) > 0), `nobody subscribed to ${channel}`);
    await sleep(50);
  };

  /**
   * A holder (TTL 1 s) releases to a waiter of its own app (TTL 60 s): too little lease is left to
   * pass it on in the process, so it is handed over through Redis; the app closes in the same
   * tick. The waiter is rejected, and the lock it was handed is released before the connection
   * closes (it stayed for its 60 s: the orphan's release went out after QUIT).
   */
  async function handOverWhileClosing(connection: string, before?: () => Promise<unknown>) {
    const app = await startLockModule({ connection, commandTimeout: 2_000 });
    const key = uniqueKey();
    let closed = false;
    try {
      const holder = await app.locks.acquire(key, { ttl: 1_000 });
      const waiter = app.locks.acquire(key, { ttl: 60_000, acquireTimeout: 10_000 });
      waiter.catch(() => {}); // asserted below
      await queued(key);
      await before?.();
      const released = holder.release();
      const closing = app.close();
      await assert.rejects(waiter, RedisLockShutdownError);
      await closing;
      closed = true;
      assert.equal(await released, true, "the holder's release failed");
      assert.equal(await redis.exists(`lock:{${key}}`), 0, "the rejected waiter's lock stayed");
    } finally {
      if (!closed) await app.close();
    }
  }

  it("a hand-over through Redis to a waiter the shutdown rejects: the waiter's lock is released before the connection closes", async () => {
    const proxy = await FaultProxy.start(() => server.port);
    try {
      // A slow link: the hand-over is answered after shutdown began.
      await handOverWhileClosing(`redis://127.0.0.1:${proxy.port}`, async () =>
        proxy.setLatency(50),
      );
    } finally {
      proxy.setLatency(0);
      await proxy.close();
    }
  });

  it('the same on a server that lost its scripts: the re-sent hand-over, and the release behind it, go out before QUIT', async () => {
    await handOverWhileClosing(server.url, () => redis.script('FLUSH'));
  });

  it('takes at most twice commandTimeout with Redis paused, an attempt in flight and a leader releasing: one deadline, then the connections are dropped', async () => {
    const commandTimeout = 1_500;
    const app = await startLockModule({ connection: server.url, commandTimeout });
    const locks: LockService = app.locks;
    let closed = false;
    try {
      const leader = locks.lead(uniqueKey('leader'), ({ signal }) => {
        return new Promise((resolve) => signal.addEventListener('abort', resolve));
      });
      assert.ok(await eventually(() => leader.isLeader));
      const held = await locks.acquire(uniqueKey(), { ttl: 30_000 });
      assert.ok(held);
      server.signal('SIGSTOP');
      const pending = locks.acquire(uniqueKey(), { ttl: 30_000 });
      pending.catch(() => {}); // rejected by the shutdown
      await sleep(50);
      const watch = watchStalls();
      const started = performance.now();
      await app.close();
      closed = true;
      const took = performance.now() - started;
      assertWithin(took, 2 * commandTimeout, watch, 'shutdown');
      watch.stop();
      await assert.rejects(pending, RedisLockShutdownError);
    } finally {
      server.signal('SIGCONT');
      if (!closed) await app.close();
    }
  });
});
