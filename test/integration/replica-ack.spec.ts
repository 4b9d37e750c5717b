import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import { Redis } from 'ioredis';
import {
  LockBackendError,
  LockReplicationError,
  RedisLockConfigurationError,
} from '../../lib/index.js';
import {
  eventually,
  sleep,
  startLockModule,
  uniqueKey,
  waitingCallers,
  type LockModuleFixture,
} from '../support/lock-module.js';
import { monitorRedis, type MonitoredCommand } from '../support/redis-monitor.js';
import {
  ACQUIRE_SCRIPT,
  ACQUIRE_UNRESERVED_SCRIPT,
  HANDOFF_SCRIPT,
  HANDOFF_UNRESERVED_SCRIPT,
  PASS_ON_SCRIPT,
} from '../../lib/redis/lock.scripts.js';
import { createHash } from 'node:crypto';
import { startRedis, type RedisServer } from '../support/redis-server.js';
import { assertWithin, watchStalls } from '../support/timing.js';

describe('replicaAck: lock writes confirmed by replicas (WAIT)', () => {
  let master: RedisServer;
  let replica: RedisServer;
  let onReplica: Redis;
  let onMaster: Redis;
  let acked: LockModuleFixture;
  let plain: LockModuleFixture;

  before(async () => {
    master = await startRedis();
    replica = await startRedis(['--replicaof', master.host, String(master.port)]);
    onReplica = new Redis(replica.port, replica.host);
    onMaster = new Redis(master.port, master.host);
    assert.ok(
      await eventually(async () =>
        (await onReplica.info('replication')).includes('link_status:up'),
      ),
    );
    // The replica answers WAIT: it is in sync and acknowledging.
    await onMaster.set('probe', '1');
    assert.equal(await onMaster.wait(1, 10_000), 1);
    // Generous bounds: test machines are loaded, and WAIT is one more round trip through a replica.
    acked = await startLockModule({
      connection: master.url,
      commandTimeout: 3_000,
      replicaAck: { replicas: 1, timeout: 1_000 },
    });
    plain = await startLockModule({ connection: master.url });
  });
  after(async () => {
    replica?.signal('SIGCONT');
    await acked?.close();
    await plain?.close();
    onReplica?.disconnect();
    onMaster?.disconnect();
    await replica?.stop();
    await master?.stop();
  });

  it('a lock is on the replica when acquire() returns, and an extension when extend() does', async () => {
    for (let i = 0; i < 20; i++) {
      const key = uniqueKey();
      const lock = await acked.locks.acquire(key, { ttl: 5_000 });
      // Read at once, no waiting: WAIT returned only after the replica had the write.
      assert.equal(await onReplica.get(`lock:{${key}}`), lock.token);
      await lock.extend(60_000);
      assert.ok((await onReplica.pttl(`lock:{${key}}`)) > 5_000);
      await lock.release();
    }
  });

  it("passes no lock on within the process: each waiter's grant is its own write, with a WAIT behind it", async () => {
    const key = uniqueKey();
    const lockKey = `lock:{${key}}`;
    const sha = (script: string): string => createHash('sha1').update(script).digest('hex');
    const acquiring = new Set([ACQUIRE_SCRIPT, ACQUIRE_UNRESERVED_SCRIPT].map(sha));
    const acquisitionsOf = (commands: readonly MonitoredCommand[]): MonitoredCommand[] =>
      commands.filter(
        ({ args }) => args[0] === 'evalsha' && acquiring.has(args[1]) && args[3] === lockKey,
      );
    const monitor = await monitorRedis(master.port);
    const fences: number[] = [];
    try {
      const first = await acked.locks.acquire(key, { ttl: 10_000 });
      fences.push(first.fence);
      const waiters = [1, 2, 3].map(() =>
        acked.locks.using(
          key,
          async (lock) => {
            fences.push(lock.fence);
            await sleep(5);
          },
          { acquireTimeout: 8_000 },
        ),
      );
      assert.ok(await eventually(() => waitingCallers(acked.locks, key) === 3));
      await first.release();
      await Promise.all(waiters);
      // MONITOR's lines come on a socket of their own, after the replies: until the WAIT behind
      // the last acquisition has arrived, fewer WAITs than acquisitions are seen.
      const waits = (): number => monitor.commands.filter(({ args }) => args[0] === 'wait').length;
      assert.ok(await eventually(() => waits() >= acquisitionsOf(monitor.commands).length));
    } finally {
      monitor.stop();
    }
    assert.equal(fences.length, 4);
    const sent = monitor.commands;
    const handedOn = new Set([HANDOFF_SCRIPT, HANDOFF_UNRESERVED_SCRIPT, PASS_ON_SCRIPT].map(sha));
    assert.deepEqual(
      sent.filter(({ args }) => args[0] === 'evalsha' && handedOn.has(args[1])),
      [],
      'a hand-over or pass-on script: a grant without WAIT',
    );
    // Every acquisition of the key (granted or not) is followed by WAIT on its connection.
    const acquisitions = acquisitionsOf(sent);
    assert.ok(acquisitions.length >= 4, `${acquisitions.length} acquisitions for 4 grants`);
    for (const acquisition of acquisitions) {
      const next = sent
        .slice(sent.indexOf(acquisition) + 1)
        .find(({ source }) => source === acquisition.source);
      assert.equal(next?.args[0], 'wait', `after an acquisition: ${next?.args.join(' ')}`);
    }
  });

  it('no replica in time: the acquisition fails with LockReplicationError and leaves no lock', async () => {
    const key = uniqueKey();
    const held = await acked.locks.acquire(uniqueKey(), { ttl: 10_000 });
    replica.signal('SIGSTOP');
    try {
      const watch = watchStalls();
      const started = performance.now();
      const error = await acked.locks.acquire(key).then(
        () => assert.fail('acquired without the replica'),
        (error: unknown) => error,
      );
      const took = performance.now() - started;
      assert.ok(error instanceof LockReplicationError, String(error));
      assert.ok(error instanceof LockBackendError);
      assert.deepEqual(
        [error.operation, error.replicas, error.acknowledged, error.timeout],
        ['acquire', 1, 0, 1_000],
      );
      assert.ok(took >= 990, `took ${took.toFixed(0)} ms`);
      assertWithin(took, 1_000, watch, 'the acquisition waiting for the replica (WAIT 1 s)');
      watch.stop();
      assert.equal(await onMaster.exists(`lock:{${key}}`), 0, 'undone on the master');
      // An extension is made on the master, but not confirmed: extend() says so.
      await assert.rejects(held.extend(), (extendError: unknown) => {
        assert.ok(extendError instanceof LockReplicationError);
        assert.equal(extendError.operation, 'extend');
        return true;
      });
    } finally {
      replica.signal('SIGCONT');
    }
    assert.equal(await held.release(), true);
    // With the replica back, locking works again.
    const lock = await acked.locks.acquire(key);
    await lock.release();
  });

  it('what it costs: acquire + release with and without replicaAck (medians, side by side)', async (t) => {
    const rounds = 300;
    const times: Record<'plain' | 'acked', number[]> = { plain: [], acked: [] };
    for (let i = 0; i < rounds; i++) {
      for (const [name, fixture] of [
        ['plain', plain],
        ['acked', acked],
      ] as const) {
        const started = performance.now();
        const lock = await fixture.locks.acquire(`cost:${i % 10}`);
        await lock.release();
        times[name].push(performance.now() - started);
      }
    }
    const median = (values: number[]): number =>
      values.sort((a, b) => a - b)[Math.floor(values.length / 2)];
    const [withoutAck, withAck] = [median(times.plain), median(times.acked)];
    t.diagnostic(
      `acquire + release, median of ${rounds}: ${withoutAck.toFixed(3)} ms without, ${withAck.toFixed(3)} ms with replicaAck (1 replica on loopback)`,
    );
    // WAIT returns as soon as the replica acknowledges, not after replicaAck.timeout (1 s).
    assert.ok(withAck < withoutAck + 250, `${withAck.toFixed(3)} ms with replicaAck`);
  });

  it('rejects replicaAck values that cannot work, naming them', async () => {
    const cases: [object, RegExp][] = [
      [{ replicaAck: { replicas: 0, timeout: 100 } }, /"replicaAck.replicas"/],
      [{ replicaAck: { replicas: 1.5, timeout: 100 } }, /"replicaAck.replicas"/],
      [{ replicaAck: { replicas: 1, timeout: 0 } }, /"replicaAck.timeout"/],
      [{ replicaAck: { replicas: 1 } }, /"replicaAck.timeout"/],
      [{ replicaAck: { replicas: 1, timeout: 100, wait: true } }, /"replicaAck.wait"/],
      [
        { replicaAck: { replicas: 1, timeout: 1_000 } },
        /"replicaAck.timeout \+ commandTimeout".*shorter than commandTimeout/,
      ],
      [{ replicaAck: 1 }, /"replicaAck"/],
    ];
    for (const [options, message] of cases) {
      await assert.rejects(
        startLockModule({ connection: master.url, ...options }),
        (error: unknown) => {
          assert.ok(error instanceof RedisLockConfigurationError, String(error));
          assert.match(error.message, message);
          return true;
        },
      );
    }
    await assert.rejects(
      startLockModule({
        nodes: ['redis://127.0.0.1:1', 'redis://127.0.0.1:2', 'redis://127.0.0.1:3'],
        replicaAck: { replicas: 1, timeout: 100 },
      }),
      /"replicaAck \+ nodes"/,
    );
  });
});
