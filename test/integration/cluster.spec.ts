import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import { Cluster } from 'ioredis';
import {
  eventually,
  sleep,
  startLockModule,
  uniqueKey,
  type LockModuleFixture,
} from '../support/lock-module.js';
import { countIncrements } from '../support/processes.js';
import {
  startCluster,
  type RedisClusterFixture,
  type RedisServer,
} from '../support/redis-server.js';

describe('on Redis Cluster', () => {
  let cluster: RedisClusterFixture;
  let clients: Cluster[];
  let app: LockModuleFixture;
  let other: LockModuleFixture;

  before(async () => {
    cluster = await startCluster(3);
    const startupNodes = cluster.nodes.map((node) => ({ host: node.host, port: node.port }));
    clients = [new Cluster(startupNodes), new Cluster(startupNodes)];
    app = await startLockModule({ client: clients[0] });
    other = await startLockModule({ client: clients[1] });
  });
  after(async () => {
    await app?.close();
    await other?.close();
    for (const client of clients ?? []) client.disconnect();
    await cluster?.stop();
  });

  it('locks keys in every slot, with fences, and excludes a second app', async () => {
    for (let i = 0; i < 30; i++) {
      const key = uniqueKey(`k${i}`);
      const lock = await app.locks.acquire(key);
      assert.ok(lock.fence > 0);
      assert.equal(await other.locks.tryAcquire(key), null);
      assert.equal(await app.locks.isLocked(key), true);
      await lock.release();
      const next = await other.locks.acquire(key, { acquireTimeout: 0 });
      assert.ok(next.fence > lock.fence);
      await next.release();
    }
  });

  it('wakes a waiter in another app on release', async () => {
    const key = uniqueKey();
    const held = await app.locks.acquire(key, { ttl: 30_000 });
    const waiting = other.locks.acquire(key, { acquireTimeout: 5_000 });
    await sleep(150);
    const releasedAt = performance.now();
    await held.release();
    const lock = await waiting;
    assert.ok(
      performance.now() - releasedAt < 100,
      `handoff took ${(performance.now() - releasedAt).toFixed(0)} ms`,
    );
    await lock.release();
  });

  it('control: 3 processes incrementing without the lock lose updates; under it the count is exact', async () => {
    const target = `cluster:${cluster.nodes.map((node) => node.port).join(',')}`;
    const read = (counter: string): Promise<string | null> => clients[0].get(counter);
    assert.ok((await countIncrements(target, 3, 300, 'nolock', read)) < 900);
    assert.equal(await countIncrements(target, 3, 25, 'lock', read), 75);
  });

  it('announces releases with sharded pub/sub, on the node that owns the key only', async () => {
    const key = uniqueKey();
    const channel = `lock:{${key}}:released`;
    const held = await app.locks.acquire(key, { ttl: 30_000 });
    const waiting = other.locks.acquire(key, { acquireTimeout: 5_000 });
    const owner = await cluster.ownerOf(
      Number(await cluster.cli(cluster.nodes[0], 'cluster', 'keyslot', channel)),
    );
    const count = async (node: RedisServer, kind: 'shardnumsub' | 'numsub'): Promise<number> =>
      Number((await cluster.cli(node, 'pubsub', kind, channel)).trim().split('\n')[1]);
    assert.ok(await eventually(async () => (await count(owner, 'shardnumsub')) === 1));
    for (const node of cluster.nodes)
      assert.equal(await count(node, 'numsub'), 0, 'no classic subscription');
    await held.release();
    const lock = await waiting;
    await lock.release();
  });

  it('auto-extends and releases through the cluster', async () => {
    const key = uniqueKey();
    await app.locks.using(
      key,
      async (lock) => {
        await sleep(500);
        assert.equal(lock.signal.aborted, false);
        assert.equal(await other.locks.tryAcquire(key), null);
      },
      { ttl: 200 },
    );
    assert.equal(await app.locks.isLocked(key), false);
  });
});
