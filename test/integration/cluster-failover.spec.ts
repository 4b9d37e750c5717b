import assert from 'node:assert/strict';
import { inspect } from 'node:util';
import { after, before, describe, it } from 'node:test';
import { Cluster, Redis } from 'ioredis';
import { LockBackendError, LockReplicationError } from '../../lib/index.js';
import {
  eventually,
  sleep,
  startLockModule,
  uniqueKey,
  waitingCallers,
  type LockModuleFixture,
} from '../support/lock-module.js';
import {
  keySlot,
  startCluster,
  type RedisClusterFixture,
  type RedisServer,
} from '../support/redis-server.js';
import { assertWithin, watchStalls } from '../support/timing.js';

describe('on Redis Cluster with replicas (3 masters, 1 replica each), resharded and failed over', () => {
  let cluster: RedisClusterFixture;
  let clients: Cluster[];
  let app: LockModuleFixture;
  let other: LockModuleFixture;
  let acked: LockModuleFixture;
  /** Masters this suite killed. */
  const dead = new Set<RedisServer>();

  before(async () => {
    cluster = await startCluster(3, 1);
    const startupNodes = cluster.nodes.map(({ host, port }) => ({ host, port }));
    clients = [0, 1, 2].map(() => new Cluster(startupNodes).on('error', () => {}));
    app = await startLockModule({ client: clients[0] });
    other = await startLockModule({ client: clients[1] });
    acked = await startLockModule({
      client: clients[2],
      commandTimeout: 3_000,
      replicaAck: { replicas: 1, timeout: 1_000 },
    });
  });
  after(async () => {
    await app?.close();
    await other?.close();
    await acked?.close();
    for (const client of clients ?? []) client.disconnect();
    await cluster?.stop();
  });

  const slotOf = (key: string): number => keySlot(`lock:{${key}}`);
  const idOf = async (node: RedisServer): Promise<string> => {
    const id = (await cluster.cli(node, 'cluster', 'myid')).trim();
    assert.match(id, /^[0-9a-f]{40}$/, `node ${node.port}'s id`);
    return id;
  };
  const masters = async (): Promise<RedisServer[]> => {
    const live = cluster.nodes.filter((node) => !dead.has(node));
    const roles = await Promise.all(live.map((node) => cluster.cli(node, 'role')));
    return live.filter((_, i) => roles[i].startsWith('master'));
  };
  /**
   * A live master other than `except`. Waits for one (a node may still be changing roles after a
   * failover), and if none comes, fails saying what role every live node reports.
   */
  async function liveMaster(except?: RedisServer): Promise<RedisServer> {
    let found: RedisServer | undefined;
    const any = async (): Promise<boolean> =>
      (found = (await masters()).find((node) => node !== except)) !== undefined;
    if (await eventually(any, 10_000)) return found!;
    const live = cluster.nodes.filter((node) => !dead.has(node));
    const roles = await Promise.all(
      live.map((node) =>
        cluster.cli(node, 'role').then(
          (role) => `${node.port}: ${role.split('\n')[0]}`,
          (error: unknown) => `${node.port}: ${String(error)}`,
        ),
      ),
    );
    assert.fail(`no live master other than ${except?.port ?? 'none'}: ${roles.join(', ')}`);
  }
  /** `count` fresh keys whose locks live on `master`. */
  async function keysOn(master: RedisServer, count = 1): Promise<string[]> {
    // Right after a reshard or a failover, the node asked may not list the master's slots yet:
    // without any, the search below would never end.
    let ranges: [number, number][] = [];
    assert.ok(
      await eventually(
        async () => (ranges = (await cluster.slotTable()).get(master) ?? []).length > 0,
      ),
      `the slot table shows no slots on master ${master.port}`,
    );
    const keys: string[] = [];
    while (keys.length < count) {
      const key = uniqueKey();
      const slot = slotOf(key);
      if (ranges.some(([from, to]) => from <= slot && slot <= to)) keys.push(key);
    }
    return keys;
  }
  const keyOn = async (master: RedisServer): Promise<string> => (await keysOn(master))[0];

  /** The replica of `master`. */
  async function replicaOf(master: RedisServer): Promise<RedisServer> {
    const id = await idOf(master);
    for (const node of cluster.nodes) {
      if (dead.has(node) || node === master) continue;
      if ((await cluster.cli(node, 'cluster', 'nodes')).includes(`myself,slave ${id}`)) return node;
    }
    throw new Error(`no replica of ${master.port}`);
  }

  /**
   * Reads `lock:{key}` on a replica (READONLY connection). A replica whose view of the slots still
   * converges after the previous test's failover answers MOVED for a while (seen once under
   * load): asked again for up to 10 s, then the MOVED fails the test.
   */
  async function onReplica(replica: RedisServer, key: string): Promise<string | null> {
    const direct = new Redis(replica.port, replica.host);
    try {
      await direct.call('READONLY');
      const deadline = performance.now() + 10_000;
      for (;;) {
        try {
          return await direct.get(`lock:{${key}}`);
        } catch (error) {
          if (!/^MOVED/.test(String((error as Error).message)) || performance.now() > deadline) {
            throw error;
          }
          await sleep(50);
        }
      }
    } finally {
      direct.disconnect();
    }
  }

  /**
   * Tries a fresh key on the slots of `master` every 20 ms until locked; ms since `since`. Fails
   * after 20 s (a test never waits without a bound).
   */
  async function lockingResumed(key: () => string, since: number): Promise<number> {
    let lastError: unknown = 'the key was taken';
    while (performance.now() - since < 20_000) {
      const watch = watchStalls();
      const asked = performance.now();
      let failed: unknown;
      const lock = await app.locks.tryAcquire(key()).catch((error: unknown) => {
        lastError = failed = error;
        return null;
      });
      // Meanwhile a call on those slots fails with LockBackendError within commandTimeout (the
      // default 1 s), never hangs, never another error.
      if (failed !== undefined) {
        assert.ok(failed instanceof LockBackendError, inspect(failed));
        assertWithin(performance.now() - asked, 1_000, watch, 'a call on the failed slots');
      }
      watch.stop();
      if (lock) {
        await lock.release();
        return performance.now() - since;
      }
      await sleep(20);
    }
    assert.fail(`locking did not resume within 20 s; last attempt: ${String(lastError)}`);
  }

  it('spreads keys over every master', async () => {
    const locks = await Promise.all(
      Array.from({ length: 60 }, () => app.locks.acquire(uniqueKey('spread'))),
    );
    for (const master of await masters()) {
      assert.ok(Number(await cluster.cli(master, 'dbsize')) > 0, `no lock on ${master.port}`);
    }
    await Promise.all(locks.map((lock) => lock.release()));
  });

  it('follows MOVED when the slot of a held lock is resharded to another master', async () => {
    const [source, target] = await masters();
    const key = await keyOn(source);
    const slot = slotOf(key);
    const lock = await app.locks.acquire(key, { ttl: 30_000 });
    const waiting = other.locks.acquire(key, { acquireTimeout: 10_000 });
    assert.ok(
      await eventually(() => waitingCallers(other.locks, key) === 1),
      'the other app waits',
    );
    // Move the slot by hand, as redis-cli --cluster reshard does. redis-cli exits 0 on an error
    // reply: each step's reply is checked, and kept for the diagnosis.
    const steps: string[] = [];
    const step = async (node: RedisServer, ...args: string[]): Promise<string> => {
      const reply = (await cluster.cli(node, ...args)).trim();
      steps.push(`${node.port} ${args.join(' ')}: ${reply}`);
      return reply;
    };
    const [sourceId, targetId] = await Promise.all([idOf(source), idOf(target)]);
    assert.equal(
      await step(target, 'cluster', 'setslot', String(slot), 'importing', sourceId),
      'OK',
    );
    assert.equal(
      await step(source, 'cluster', 'setslot', String(slot), 'migrating', targetId),
      'OK',
    );
    const keys = (await cluster.cli(source, 'cluster', 'getkeysinslot', String(slot), '100'))
      .trim()
      .split('\n');
    // The lock, the fence counter of its slot (shared by the slot's keys), and the queue of the
    // processes waiting for it (the other app's).
    assert.equal(keys.length, 3, keys.join(', '));
    assert.ok(keys.includes(`lock:{${key}}`));
    assert.ok(keys.includes(`lock:{${key}}:turns`));
    assert.ok(keys.some((name) => name.endsWith(':counter') && keySlot(name) === slot));
    const migrated = await step(
      source,
      'migrate',
      target.host,
      String(target.port),
      '',
      '0',
      '5000',
      'keys',
      ...keys,
    );
    assert.equal(migrated, 'OK', steps.join('; '));
    // The new owner first, then the old one, then the rest (the order the Redis docs give).
    const others = (await masters()).filter((node) => node !== source && node !== target);
    for (const master of [target, source, ...others]) {
      const reply = await step(master, 'cluster', 'setslot', String(slot), 'node', targetId);
      if (master === target || master === source) assert.equal(reply, 'OK', steps.join('; '));
    }
    // As the masters told see it. A replica learns the move by gossip, which took over 20 s in
    // a loaded clean-clone run (FLAKY twice when this read the first node that answers, possibly
    // a replica); the client does not need it: a stale view sends it to the old owner, whose
    // MOVED it follows.
    for (const by of [target, source]) {
      const moved = await eventually(
        () =>
          cluster.ownerOf(slot, [by]).then(
            (owner) => owner === target,
            () => false, // a view in the middle of the move may name no owner yet
          ),
        20_000,
      );
      if (!moved) {
        const views = await Promise.all(
          [target, source].map(async (node) => {
            const table = await cluster.cli(node, 'cluster', 'nodes').catch(String);
            return `${node.port} sees:\n${table}`;
          }),
        );
        assert.fail(
          `slot ${slot} not moved to ${target.port} in ${by.port}'s view within 20 s; steps: ${steps.join('; ')}\n${views.join('\n')}`,
        );
      }
    }

    await lock.extend().catch(async (error: unknown) => {
      // Say where the lock is (or is not), and what every node thinks it is, for a diagnosis.
      const nodes = await Promise.all(
        cluster.nodes
          .filter((node) => !dead.has(node))
          .map(async (node) => {
            const [role, info, value] = await Promise.all([
              cluster.cli(node, 'role'),
              cluster.cli(node, 'cluster', 'info'),
              cluster.cli(node, 'get', `lock:{${key}}`),
            ]);
            const epoch = /current_epoch:(\d+)/.exec(info)?.[1];
            return `${node.port} ${role.split('\n')[0]} epoch ${epoch}: ${value.trim() || '(nil)'}`;
          }),
      );
      assert.fail(
        `${String(error)}; token ${lock.token}, source ${source.port}, target ${target.port}; ${nodes.join('; ')}`,
      );
    });
    assert.equal(await other.locks.tryAcquire(key), null);
    const watch = watchStalls();
    const releasedAt = performance.now();
    assert.equal(await lock.release(), true);
    // The waiter's sharded subscription is on the old owner, which no longer carries the slot's
    // messages: it gets the lock at its next retry (retryInterval, 1 s, + 50 ms) at the latest.
    const next = await waiting;
    assertWithin(performance.now() - releasedAt, 1_050, watch, 'the wait after the release');
    watch.stop();
    assert.ok(next.fence > lock.fence);
    await next.release();
  });

  it('a lock write with replicaAck is on the replica when acquire() returns (WAIT on the owning node)', async () => {
    for (const master of await masters()) {
      const key = await keyOn(master);
      const lock = await acked.locks.acquire(key);
      assert.equal(await onReplica(await replicaOf(master), key), lock.token);
      await lock.release();
    }
  });

  for (const how of ['CLUSTER FAILOVER', 'a killed master'] as const) {
    it(`locking resumes after ${how}; a replicated lock survives it`, async (t) => {
      const master = await liveMaster();
      const replica = await replicaOf(master);
      const heldKey = await keyOn(master);
      const held = await acked.locks.acquire(heldKey, { ttl: 30_000 });
      assert.equal(await onReplica(replica, heldKey), held.token);
      const keys = await keysOn(master, 200);
      let next = 0;
      // (While the failed master's slots have no owner, ownerOf throws: not yet.)
      const promoted = (): Promise<boolean> =>
        cluster.ownerOf(slotOf(heldKey)).then(
          (owner) => owner === replica,
          () => false,
        );
      const watch = watchStalls();
      const started = performance.now();
      if (how === 'CLUSTER FAILOVER') {
        await cluster.cli(replica, 'cluster', 'failover');
        // A manual failover gives up after 5 s when the pair cannot coordinate (a loaded machine):
        // then ask once more.
        if (!(await eventually(promoted, 6_000))) await cluster.cli(replica, 'cluster', 'failover');
      } else {
        dead.add(master);
        await master.kill();
        // The other masters' slots lock as before while this one's are failing over.
        const elsewhere = await liveMaster(replica);
        const lock = await app.locks.acquire(await keyOn(elsewhere), { acquireTimeout: 0 });
        await lock.release();
      }
      assert.ok(await eventually(promoted, 15_000), 'the replica took over the slots');
      const switched = performance.now() - started;
      // Locks on the failed master's slots, from when the cluster switched.
      const resumed = await lockingResumed(() => keys[next++ % keys.length], started);
      t.diagnostic(
        `${how}: the cluster switched after ${switched.toFixed(0)} ms, locks on those slots taken again ${(resumed - switched).toFixed(0)} ms later`,
      );
      assertWithin(resumed - switched, 1_300, watch, 'locking again after the switch');
      watch.stop();
      // Every live node agrees again (no CLUSTERDOWN from a node still converging: the client may
      // ask any of them while its slot map catches up).
      const live = cluster.nodes.filter((node) => !dead.has(node));
      assert.ok(
        await eventually(async () =>
          (await Promise.all(live.map((node) => cluster.cli(node, 'cluster', 'info')))).every(
            (info) => info.includes('cluster_state:ok'),
          ),
        ),
        'every live node reports cluster_state:ok',
      );
      // The promoted replica had the lock: it is still held, and can be extended and released.
      assert.equal(await other.locks.tryAcquire(heldKey), null);
      if (how === 'CLUSTER FAILOVER') {
        await held.extend(); // the old master is the new master's replica: WAIT is answered
      } else {
        // The promoted master has no replica left: replicaAck writes fail, and say why.
        await assert.rejects(held.extend(), LockReplicationError);
        await assert.rejects(acked.locks.acquire(await keyOn(replica)), LockReplicationError);
      }
      assert.equal(await held.release(), true);
    });
  }
});
