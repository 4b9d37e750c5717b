import assert from 'node:assert/strict';
import { once } from 'node:events';
import { after, before, describe, it } from 'node:test';
import { Test } from '@nestjs/testing';
import { Redis } from 'ioredis';
import {
  LockAcquireAbortedError,
  LockAcquireTimeoutError,
  LockArgumentError,
  LockBackendError,
  LockLostError,
  LockQuorumError,
  RedisLockConfigurationError,
  RedisLockModule,
  LockService,
  type Lock,
} from '../../lib/index.js';
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
import { FaultProxy, posingAsRedis6 } from '../support/fault-proxy.js';
import { listeners } from '../support/listeners.js';
import { monitorRedis } from '../support/redis-monitor.js';
import {
  ACQUIRE_OWN_TOKEN_REDLOCK_SCRIPT,
  HANDOFF_SCRIPT,
  HANDOFF_UNRESERVED_SCRIPT,
  PASS_ON_SCRIPT,
  RAISE_FENCE_SCRIPT,
  RELEASE_SCRIPT,
} from '../../lib/redis/lock.scripts.js';
import { createHash } from 'node:crypto';
import { raceThenLock, transfersRaceThenLock } from '../support/processes.js';
import { startRedis, type RedisServer } from '../support/redis-server.js';
import { scriptsRunOn } from '../support/commandstats.js';
import { assertWithin, watchStalls } from '../support/timing.js';
import { assertElectionReadable } from '../support/election.js';

const NODES = 5;

describe('Redlock mode (nodes: 5 independent masters)', () => {
  let servers: RedisServer[];
  let direct: Redis[];
  let app: LockModuleFixture;
  let other: LockModuleFixture;
  let locks: LockService;

  before(async () => {
    servers = await Promise.all(Array.from({ length: NODES }, () => startRedis()));
    direct = servers.map((server) =>
      // Nodes crash in these tests: the test's own clients reconnect quietly.
      new Redis(server.port, server.host).on('error', () => {}),
    );
    const nodes = servers.map((server) => server.url);
    app = await startLockModule({ nodes });
    other = await startLockModule({ nodes });
    locks = app.locks;
  });
  after(async () => {
    for (const server of servers ?? []) server.signal('SIGCONT');
    await app?.close();
    await other?.close();
    for (const client of direct ?? []) client.disconnect();
    await Promise.all((servers ?? []).map((server) => server.stop()));
  });

  /** The module's own connections to the nodes. */
  const nodeClients = (fixture: LockModuleFixture): Redis[] =>
    (
      fixture.locks as unknown as { engine: { backend: { nodes: { client: Redis }[] } } }
    ).engine.backend.nodes.map((node) => node.client);

  /** The nodes on which `key` is held by `token` right now. */
  const holders = async (key: string, token: string, among = servers.keys()): Promise<number> => {
    let count = 0;
    for (const i of among) if ((await direct[i].get(`lock:{${key}}`)) === token) count++;
    return count;
  };

  /**
   * `key` held by `locks` (5 s) with the nodes' fences apart for whoever comes next: two nodes'
   * counters ahead of the clock (~11 days; they stay safe integers), from which the holder takes
   * its fence (its second round brings every node's counter to it); then three nodes lose their
   * counter (a restart), so their next fences come from the clock, below the holder's, and the two
   * others' above it.
   */
  async function heldWithFencesApart(key: string): Promise<Lock> {
    const counter = 'lock:{}:counter';
    const [seconds, micros] = await direct[0].time();
    const ahead = (Number(seconds) * 1_000_000 + Number(micros) + 1e12).toFixed(0);
    await Promise.all([0, 1].map((i) => direct[i].set(counter, ahead, 'KEEPTTL')));
    const lock = await locks.acquire(key, { ttl: 5_000 });
    assert.ok(lock.fence > Number(ahead), `the holder's fence ${lock.fence}`);
    await Promise.all([2, 3, 4].map((i) => direct[i].del(counter)));
    return lock;
  }

  /** Runs `fn` while the given nodes are frozen (SIGSTOP). */
  async function pausing<T>(indexes: number[], fn: () => Promise<T>): Promise<T> {
    for (const i of indexes) servers[i].signal('SIGSTOP');
    try {
      return await fn();
    } finally {
      for (const i of indexes) servers[i].signal('SIGCONT');
    }
  }

  /** Freezes nodes one at a time (SIGSTOP); `thaw(i)` resumes one, `thaw()` every one still frozen. */
  function freezer(): { freeze(i: number): void; thaw(i?: number): void } {
    const frozen = new Set<number>();
    return {
      freeze(i) {
        servers[i].signal('SIGSTOP');
        frozen.add(i);
      },
      thaw(i) {
        for (const j of i === undefined ? [...frozen] : [i]) {
          servers[j].signal('SIGCONT');
          frozen.delete(j);
        }
      },
    };
  }

  /** Crashes the given nodes; `revive()` starts them again, empty, on the same ports. */
  async function crash(indexes: number[]): Promise<{ revive(): Promise<void> }> {
    await Promise.all(indexes.map((i) => servers[i].kill()));
    return {
      revive: async () => {
        await Promise.all(
          indexes.map(async (i) => {
            servers[i] = await servers[i].restart();
          }),
        );
        // Every client reconnects by itself (ioredis backs off up to 2 s); wait until they have.
        const clients = [...direct, ...[app, other].flatMap(nodeClients)];
        assert.ok(await eventually(() => clients.every((client) => client.status === 'ready')));
      },
    };
  }

  it('writes the lock on every node, excludes a second app and wakes its waiter on release', async () => {
    const key = uniqueKey();
    const lock = await locks.acquire(key);
    // Granted once three nodes said yes; the other two follow.
    assert.ok(await eventually(async () => (await holders(key, lock.token)) === NODES));
    assert.equal(await other.locks.tryAcquire(key), null);
    assert.equal(await other.locks.isLocked(key), true);
    const waiter = await startNonPollingApp({ nodes: servers.map((server) => server.url) });
    try {
      const waiting = waiter.locks.acquire(key, { acquireTimeout: 5_000 });
      assert.ok(await eventually(() => waitingCallers(waiter.locks, key) === 1));
      assert.equal(await lock.release(), true);
      const next = await waiting; // woken by the release: its next poll is 60 s away
      assert.ok(next.fence > lock.fence);
      // The release resolved once a majority let go; the other nodes' deletes may still be on
      // the way.
      assert.ok(await eventually(async () => (await holders(key, lock.token)) === 0));
      await next.release();
    } finally {
      await waiter.close();
    }
    assert.equal(await locks.isLocked(key), false);
  });

  it('passes no lock on within the process: a waiter of the same app takes it from the nodes itself', async () => {
    const key = uniqueKey();
    const sha = (script: string): string => createHash('sha1').update(script).digest('hex');
    const handedOn = new Set([HANDOFF_SCRIPT, HANDOFF_UNRESERVED_SCRIPT, PASS_ON_SCRIPT].map(sha));
    const monitors = await Promise.all(servers.map((server) => monitorRedis(server.port)));
    const fences: number[] = [];
    try {
      const first = await locks.acquire(key, { ttl: 10_000 });
      fences.push(first.fence);
      const waiters = [1, 2].map(() =>
        locks.using(key, (lock) => void fences.push(lock.fence), { acquireTimeout: 8_000 }),
      );
      assert.ok(await eventually(() => waitingCallers(locks, key) === 2));
      await first.release();
      await Promise.all(waiters);
    } finally {
      for (const monitor of monitors) monitor.stop();
    }
    assert.equal(fences.length, 3);
    assert.ok(fences[0] < fences[1] && fences[1] < fences[2], `fences ${fences.join(', ')}`);
    const onNodes = monitors.flatMap((monitor) => monitor.commands);
    assert.deepEqual(
      onNodes.filter(({ args }) => args[0] === 'evalsha' && handedOn.has(args[1])),
      [],
      'a hand-over or pass-on script',
    );
  });

  /** The module's startup with `nodes`: its error, or `undefined` if it started (then closed). */
  const startupError = async (nodes: string[]): Promise<unknown> => {
    const module = await Test.createTestingModule({
      imports: [RedisLockModule.forRoot({ nodes, commandTimeout: 300 })],
    }).compile();
    const error = await module.init().then(
      () => undefined,
      (e: unknown) => e,
    );
    // NestJS 11 rethrows a failed startup's error from close(); the service closed itself.
    await module.close().catch((closing: unknown) => assert.equal(closing, error));
    return error;
  };

  it('refuses at startup two nodes that are one server under two names (127.0.0.1 and localhost)', async () => {
    const nodes = [
      servers[0].url,
      servers[0].url.replace('127.0.0.1', 'localhost'),
      servers[1].url,
    ];
    const error = await startupError(nodes);
    assert.ok(error instanceof RedisLockConfigurationError, String(error));
    assert.equal(error.option, 'nodes[0] + nodes[1]');
  });

  it('refuses at startup a node older than Redis 7, naming it (its INFO rewritten by a proxy)', async () => {
    const proxy = await FaultProxy.start(() => servers[2].port);
    try {
      await posingAsRedis6(proxy, direct[2]);
      const nodes = servers.slice(0, 3).map((server) => server.url);
      nodes[2] = `redis://127.0.0.1:${proxy.port}`;
      const error = await startupError(nodes);
      assert.ok(error instanceof RedisLockConfigurationError, String(error));
      assert.equal(error.option, 'nodes[2]');
      assert.match(error.message, /Redis 6\.\d+\.\d+.*needs Redis 7\.0 or newer/);
    } finally {
      await proxy.close();
    }
  });

  it('starts with two of five nodes silent at startup: their unknown run_ids are not one server, and locks go on with the other three', async () => {
    const proxies = await Promise.all([3, 4].map((i) => FaultProxy.start(() => servers[i].port)));
    try {
      for (const proxy of proxies) proxy.stall();
      const nodes = servers.map((server) => server.url);
      nodes[3] = `redis://127.0.0.1:${proxies[0].port}`;
      nodes[4] = `redis://127.0.0.1:${proxies[1].port}`;
      const module = await Test.createTestingModule({
        imports: [RedisLockModule.forRoot({ nodes, commandTimeout: 300 })],
      }).compile();
      try {
        await module.init();
        const lock = await module.get(LockService).acquire(uniqueKey());
        assert.ok(lock.fence > 0);
        await lock.release();
      } finally {
        for (const proxy of proxies) proxy.heal();
        await module.close();
      }
    } finally {
      await Promise.all(proxies.map((proxy) => proxy.close()));
    }
  });

  it("leaves the app's own node clients as it found them: none of the module's listeners stays on them once it closes (found by mutation testing)", async () => {
    const clients = servers.slice(0, 3).map((server) => new Redis(server.port, server.host));
    try {
      await Promise.all(clients.map((client) => client.ping()));
      const before = clients.map(listeners);
      const fixture = await startLockModule({ nodes: clients });
      const lock = await fixture.locks.acquire(uniqueKey());
      await lock.release();
      await fixture.close();
      assert.deepEqual(clients.map(listeners), before);
      assert.deepEqual(
        clients.map((client) => client.status),
        ['ready', 'ready', 'ready'],
        'never closed',
      );
    } finally {
      for (const client of clients) client.disconnect();
    }
  });

  it('counts the clock drift: a lock is valid for ttl - 1% - 2 ms from when it was asked for', async () => {
    const before = performance.now();
    const lock = await locks.acquire(uniqueKey(), { ttl: 10_000 });
    const after = performance.now();
    assert.ok(lock.expiresAt >= before + 9_898 && lock.expiresAt <= after + 9_898);
    await lock.release();
  });

  it('a majority that grants after the validity (ttl - drift) has run out is no lock: the call does not get it, and its copies are undone', async () => {
    const key = uniqueKey();
    // Two nodes answer at once; the third vote comes 300 ms later, past a 200 ms TTL's validity.
    servers[2].signal('SIGSTOP');
    servers[3].signal('SIGSTOP');
    servers[4].signal('SIGSTOP');
    const resume = setTimeout(() => servers[2].signal('SIGCONT'), 300);
    try {
      const started = performance.now();
      const lock = await locks.tryAcquire(key, { ttl: 200 });
      assert.ok(performance.now() - started >= 250, 'the majority came late');
      assert.equal(
        lock,
        null,
        `granted with ${String(lock && lock.expiresAt - performance.now())} ms left`,
      );
    } finally {
      clearTimeout(resume);
      for (const i of [2, 3, 4]) servers[i].signal('SIGCONT');
    }
    for (const i of servers.keys()) {
      assert.ok(await eventually(async () => (await direct[i].exists(`lock:{${key}}`)) === 0));
    }
  });

  it('five nodes: the module says at start that a lock needs three and warns of nothing; a waiter is woken by the release on the nodes, not by its next poll (found by mutation testing)', async () => {
    const capture = new LogCapture();
    const module = await Test.createTestingModule({
      imports: [
        RedisLockModule.forRoot({
          nodes: servers.map((server) => server.url),
          // Polls 3 s apart: a waiter that did not hear the release would wait for its next one.
          defaults: { retryInterval: 3_000, retryJitter: 0 },
        }),
      ],
    })
      .setLogger(capture)
      .compile();
    await module.init();
    const waiting = module.get(LockService);
    try {
      assert.deepEqual(
        capture.lines.filter((line) => line.level === 'warn').map(({ message }) => message),
        [],
      );
      assert.ok(
        capture.lines.some(
          ({ level, message }) =>
            level === 'log' && message === 'Redlock mode: 5 nodes, a lock needs 3 of them.',
        ),
        JSON.stringify(capture.lines),
      );
      const key = uniqueKey();
      const holder = await locks.acquire(key, { ttl: 30_000 });
      const waiter = waiting.acquire(key, { acquireTimeout: 10_000 });
      // Its first attempt refused, the waiter listens on every node before the release is sent.
      const channel = `lock:{${key}}:released`;
      assert.ok(
        await eventually(async () => {
          const counts = await Promise.all(
            direct.map(async (client) => (await client.pubsub('NUMSUB', channel))[1] as number),
          );
          return counts.every((count) => count > 0);
        }),
        'the waiter never subscribed to releases on every node',
      );
      const watch = watchStalls();
      const released = performance.now();
      await holder.release();
      const lock = await waiter;
      // Woken, it asks the nodes at once (one Redlock acquisition: up to two rounds on five
      // nodes, allowed a second here); left to its poll, it would ask 3 s after its last attempt.
      assertWithin(performance.now() - released, 1_000, watch, 'a waiter woken by a release');
      watch.stop();
      await lock.release();
    } finally {
      await module.close();
    }
  });

  it('four nodes: the module warns at start; a lock needs three of them; two that answer are no majority', async () => {
    const capture = new LogCapture();
    const module = await Test.createTestingModule({
      imports: [
        RedisLockModule.forRoot({
          nodes: servers.slice(0, 4).map((server) => server.url),
          commandTimeout: 300,
        }),
      ],
    })
      .setLogger(capture)
      .compile();
    await module.init();
    const four = { locks: module.get(LockService), close: () => module.close() };
    try {
      assert.deepEqual(
        capture.lines.filter((line) => line.level === 'warn').map(({ message }) => message),
        [
          'Redlock with 4 nodes tolerates no more failures than with 3: use an odd number of nodes.',
        ],
      );
      const key = uniqueKey();
      const error = await pausing([2, 3], () =>
        four.locks.acquire(key, { acquireTimeout: 0 }).then(
          (lock) => assert.fail(`acquired on two of four nodes (fence ${lock.fence})`),
          (error: unknown) => error,
        ),
      );
      assert.ok(
        error instanceof LockBackendError && error.cause instanceof LockQuorumError,
        String(error),
      );
      for (const i of [0, 1, 2, 3]) {
        assert.ok(await eventually(async () => (await direct[i].exists(`lock:{${key}}`)) === 0));
      }
    } finally {
      await four.close();
    }
  });

  it('auto-extends on a majority while the work runs', async () => {
    const key = uniqueKey();
    await locks.using(
      key,
      async (lock) => {
        await sleep(700);
        assert.equal(lock.signal.aborted, false);
        assert.equal(await other.locks.tryAcquire(key), null);
      },
      { ttl: 300 },
    );
    assert.equal(await locks.isLocked(key), false);
  });

  it('keeps fences increasing when the majorities of two holders differ', async () => {
    const key = uniqueKey();
    const fenceKey = 'lock:{}:counter';
    const counters = async (): Promise<number[]> =>
      (await Promise.all(direct.map((client) => client.get(fenceKey)))).map(Number);
    // Node 0 has counted far ahead of the others (it was in every majority for a long time).
    const ahead = 8_000_000_000_000_000;
    await direct[0].set(fenceKey, ahead);
    await Promise.all(direct.slice(1).map((client) => client.set(fenceKey, 5)));
    // The first holder's majority is nodes 0, 1 and 2 (3 and 4 are paused): fences ahead + 1, 6, 6.
    const first = await pausing([3, 4], () => locks.acquire(key));
    assert.equal(first.fence, ahead + 1);
    // Before the lock was granted, the counters where it is held were raised to its fence ...
    assert.ok(await eventually(async () => (await counters()).every((n) => n === ahead + 1)));
    await first.release();
    // A release resolves once a majority let go; the rest follow (awaited here, so that no node
    // still holds a copy that would make it refuse, and not count, the next holder).
    assert.ok(await eventually(async () => (await holders(key, first.token)) === 0));
    // ... so a holder whose majority leaves node 0 out still gets a higher fence.
    const second = await pausing([0], () => other.locks.acquire(key));
    assert.ok(second.fence > first.fence, `${second.fence} after ${first.fence}`);
    await second.release();
    // Node 0 was paused during that acquisition: it runs the attempt queued on the other app's
    // connection when it wakes, and the release behind it. Redis serves its connections in the
    // order they are ready, so a command on another connection (the next acquisition) may run
    // before them, as it may before any node's share of a release that already had its majority:
    // that node then refuses the next holder and does not count it, one count behind the others.
    // That is harmless (a majority counts past every fence granted, and the max is taken), but here
    // the test waits for every node to catch up, so that the next count is exact.
    assert.ok(
      await eventually(
        async () =>
          Number(await direct[0].get(fenceKey)) === second.fence &&
          (await holders(key, second.token)) === 0,
      ),
      'node 0 ran the attempt queued while it was paused, and every node the release',
    );
    // Once raised, the counters agree: every node counts the next holder's fence, none past it.
    const third = await locks.acquire(key);
    assert.ok(third.fence > second.fence);
    assert.ok(
      await eventually(async () => (await counters()).every((n) => n === third.fence)),
      `${String(await counters())} after ${third.fence}`,
    );
    await third.release();
  });

  it('works with 2 of 5 nodes down: acquire, extend, release', async () => {
    const down = await crash([3, 4]);
    try {
      const key = uniqueKey();
      const lock = await locks.acquire(key, { ttl: 2_000 });
      assert.equal(await holders(key, lock.token, [0, 1, 2].values()), 3);
      await lock.extend(5_000);
      assert.ok((await direct[0].pttl(`lock:{${key}}`)) > 2_000);
      assert.equal(await other.locks.tryAcquire(key), null);
      assert.equal(await lock.release(), true);
      const next = await other.locks.acquire(key, { acquireTimeout: 0 });
      assert.ok(next.fence > lock.fence);
      await next.release();
    } finally {
      await down.revive();
    }
  });

  it('fails with a typed error within its bound when 3 of 5 nodes are down, leaving nothing on the live nodes', async () => {
    const down = await crash([0, 1, 2]);
    try {
      const key = uniqueKey();
      const watch = watchStalls();
      const started = performance.now();
      const error = await locks.acquire(key, { acquireTimeout: 3_000 }).then(
        () => assert.fail('acquired without a majority'),
        (error: unknown) => error,
      );
      const took = performance.now() - started;
      assert.ok(error instanceof LockBackendError, String(error));
      assert.ok(error.cause instanceof LockQuorumError, String(error.cause));
      assert.equal(error.cause.quorum, 3);
      // Decided as soon as three nodes failed, whether or not the live two had answered yet.
      assert.equal(error.cause.failures.length, 3);
      assert.ok(error.cause.answered <= 2);
      assert.equal(error.cause.timedOut, false, 'every node that failed refused the connection');
      assert.equal(error.timedOut, false, 'the call says Redis answered in time');
      // Within commandTimeout (1 s), not at acquireTimeout (3 s).
      assertWithin(took, 1_000, watch, 'acquire() with 3 of 5 nodes down');
      watch.stop();
      // The undo goes to each live node on its own: wait for both, not only the first.
      for (const node of [3, 4]) {
        assert.ok(
          await eventually(async () => (await direct[node].exists(`lock:{${key}}`)) === 0),
          `the partial lock is undone on node ${node}`,
        );
      }
      await assert.rejects(locks.isLocked(key), LockBackendError);
      // Nor is their refusal a busy key: a key the live two say is held fails the same way, at
      // once, for tryAcquire() and acquire() alike (they answered null and waited out
      // acquireTimeout: found by a helper's script, with the nodes silent instead).
      const busy = uniqueKey();
      for (const node of [3, 4]) await direct[node].set(`lock:{${busy}}`, 'other', 'PX', 30_000);
      for (const call of [
        () => locks.tryAcquire(busy),
        () => locks.acquire(busy, { acquireTimeout: 3_000 }),
      ]) {
        const stalls = watchStalls();
        const from = performance.now();
        await assert.rejects(
          call(),
          (error) => error instanceof LockBackendError && error.cause instanceof LockQuorumError,
        );
        assertWithin(performance.now() - from, 1_000, stalls, 'a refusal beside 3 of 5 nodes down');
        stalls.stop();
      }
      for (const node of [3, 4]) await direct[node].del(`lock:{${busy}}`);
      // What two nodes say is no reading of the lock, nor of its election, either.
      for (const read of [() => locks.inspect(key), () => locks.leader(key)]) {
        await assert.rejects(
          read(),
          (error) => error instanceof LockBackendError && error.cause instanceof LockQuorumError,
        );
      }
    } finally {
      await down.revive();
    }
  });

  it('a round that failed on refused connections and on a silent node is a timeout (timedOut: true): the silent one may have granted', async () => {
    const down = await crash([0, 1]);
    try {
      const error = await pausing([2], () =>
        locks.acquire(uniqueKey(), { acquireTimeout: 0 }).catch((e: unknown) => e),
      );
      assert.ok(error instanceof LockBackendError, String(error));
      assert.ok(error.cause instanceof LockQuorumError, String(error.cause));
      assert.equal(error.cause.failures.length, 3);
      assert.equal(error.cause.timedOut, true);
      // And so is the call's error: a grant may still land (see LockBackendError.timedOut).
      assert.equal(error.timedOut, true);
    } finally {
      await down.revive();
    }
  });

  it('aborts the signal when no majority confirms an extension before the validity ends', async () => {
    const key = uniqueKey();
    let down: { revive(): Promise<void> } | undefined;
    try {
      const reason = await locks.using(
        key,
        async (lock) => {
          down = await crash([0, 1, 2]);
          await once(lock.signal, 'abort');
          return lock.signal.reason as unknown;
        },
        { ttl: 600 },
      );
      assert.ok(reason instanceof LockLostError);
      assert.equal(reason.reason, 'unconfirmed');
    } finally {
      await down?.revive();
    }
  });

  it('leader() and participants() read the election a majority of nodes records, also with two of five nodes paused', async () => {
    const third = await startLockModule({ nodes: servers.map((server) => server.url) });
    try {
      const key = uniqueKey('leader');
      await assertElectionReadable([app.locks, other.locks], third.locks, key, {
        // Paused only once every node has the term's copy and record: a copy a release race kept
        // off a node that stays up, and two paused that have it, leave no majority to read (nor
        // to extend the lock with).
        whileSecond: async (read, term) => {
          const recorded = async (): Promise<number> => {
            let count = 0;
            for (const client of direct) {
              const fence = await client.hget(`lock:{${key}}:leader`, 'fence');
              if (fence === String(term.fence)) count++;
            }
            return count;
          };
          assert.ok(
            await eventually(async () => (await recorded()) === NODES, 10_000),
            `the second term recorded on ${await recorded()} of ${NODES} nodes`,
          );
          await pausing([0, 4], read);
        },
      });
    } finally {
      await third.close();
    }
  });

  it('a leader with a bare majority of nodes up records its term and its participation on each of them, and says nothing of it (found by mutation testing)', async () => {
    // A bare majority: each node's write counts (every comparison of the quorum rule is seen).
    const down = [3, 4];
    const crashed = await crash(down);
    const { capture, restore } = LogCapture.install();
    const key = uniqueKey('leader');
    const leadership = locks.lead(
      key,
      ({ signal }) => new Promise((resolve) => signal.addEventListener('abort', resolve)),
      { id: 'pod-q', ttl: 900 },
    );
    try {
      const term = await leadership.elected();
      const up = direct.filter((_, i) => !down.includes(i));
      const recorded = async (): Promise<boolean> =>
        (await Promise.all(up.map((client) => client.hget(`lock:{${key}}:leader`, 'fence')))).every(
          (fence) => fence === String(term.fence),
        );
      assert.ok(await eventually(recorded), 'the term not recorded on every node up');
      assert.deepEqual(await other.locks.participants(key), ['pod-q']);
      // Two renewals of its stay (every ttl / 3) and of its record.
      await sleep(700);
      assert.deepEqual(
        capture.lines
          .filter((line) => line.level === 'warn' || line.level === 'error')
          .filter(({ message }) => /term|particip|leader/i.test(message)),
        [],
      );
    } finally {
      await leadership.stop();
      restore();
      await crashed.revive();
    }
  });

  it('leader() and participants() name no leader and no participant that only two of five nodes record (found by mutation testing)', async () => {
    const key = uniqueKey('leader');
    await Promise.all(
      [0, 1].map(async (i) => {
        const [seconds] = await direct[i].time();
        await direct[i].set(`lock:{${key}}`, 'tok-x', 'PX', 5_000);
        await direct[i].hset(`lock:{${key}}:leader`, { token: 'tok-x', id: 'pod-x', fence: '7' });
        const stay = (Number(seconds) + 10) * 1_000; // 10 s on
        await direct[i].zadd(`lock:{${key}}:participants`, stay, 'r1:pod-x');
      }),
    );
    // And another participant on two other nodes: four entries, none on a majority.
    await Promise.all(
      [2, 3].map(async (i) => {
        const [seconds] = await direct[i].time();
        await direct[i].zadd(
          `lock:{${key}}:participants`,
          (Number(seconds) + 10) * 1_000,
          'r2:pod-y',
        );
      }),
    );
    assert.equal(await other.locks.leader(key), null);
    assert.deepEqual(await other.locks.participants(key), []);
  });

  it('a term whose record a majority of nodes refuses leads on and says so; two nodes that take it are not enough (found by mutation testing)', async () => {
    const { capture, restore } = LogCapture.install();
    const key = uniqueKey('leader');
    // Three nodes hold a record their script cannot count on (a count that is no integer).
    await Promise.all(
      [0, 1, 2].map((i) => direct[i].hset(`lock:{${key}}:leader`, 'transitions', '1.5')),
    );
    const leadership = locks.lead(
      key,
      ({ signal }) => new Promise((resolve) => signal.addEventListener('abort', resolve)),
      { id: 'pod-w', ttl: 1_500 },
    );
    try {
      const term = await leadership.elected();
      const warned = (): string[] =>
        capture.lines
          .filter((line) => line.level === 'warn')
          .map(({ message }) => message)
          .filter((message) => message.startsWith(`Could not record term ${term.fence}`));
      assert.ok(await eventually(() => warned().length > 0, 5_000), 'the failed record not told');
      assert.match(warned()[0], /only 2 of 5 Redis nodes answered and 3 must agree/);
      assert.equal(term.signal.aborted, false, 'it stopped leading');
    } finally {
      await leadership.stop();
      restore();
    }
  });

  it('leader() keeps naming a leader whose nodes lost its lock and record one pair at a time: the record follows the copies its extensions write back (found by a review)', async () => {
    const key = uniqueKey('leader');
    const leadership = locks.lead(
      key,
      ({ signal }) => new Promise((resolve) => signal.addEventListener('abort', resolve)),
      { id: 'pod-r', ttl: 1_500 },
    );
    try {
      const term = await leadership.elected();
      const recorded = async (): Promise<number> => {
        let count = 0;
        for (const client of direct)
          if ((await client.hget(`lock:{${key}}:leader`, 'fence')) === String(term.fence)) count++;
        return count;
      };
      assert.ok(
        await eventually(async () => (await recorded()) === NODES),
        'the term recorded on every node',
      );
      // As if they restarted empty, two nodes at a time: the lock's copy and the record gone.
      for (const pair of [
        [0, 1],
        [2, 3],
      ]) {
        await Promise.all(pair.map((i) => direct[i].del(`lock:{${key}}`, `lock:{${key}}:leader`)));
        assert.ok(
          await eventually(async () => (await recorded()) === NODES, 5_000),
          `the record not written back on nodes ${pair.join(', ')} (${await recorded()} of ${NODES})`,
        );
      }
      assert.equal(term.signal.aborted, false);
      const info = await other.locks.leader(key);
      assert.deepEqual([info?.id, info?.fence, info?.transitions], ['pod-r', term.fence, 1]);
    } finally {
      await leadership.stop();
    }
  });

  it('transitions counts every term, also when each began with a node down (each node counts only the terms it held)', async () => {
    const key = uniqueKey('leader');
    const lead = (i: number) =>
      locks.lead(
        key,
        ({ signal }) => new Promise((resolve) => signal.addEventListener('abort', resolve)),
        { id: `pod-${i}` },
      );
    for (let i = 0; i < NODES; i++) {
      const down = await crash([i]);
      const leadership = lead(i);
      try {
        const term = await leadership.elected();
        assert.ok(
          await eventually(
            async () => (await other.locks.leader(key))?.fence === term.fence,
            5_000,
          ),
          `term ${i + 1} never showed`,
        );
        assert.equal(
          (await other.locks.leader(key))?.transitions,
          i + 1,
          `transitions in term ${i + 1}`,
        );
      } finally {
        await leadership.stop();
        await down.revive();
      }
    }
  });

  it('holdAtLeast: a release before it is up keeps the key on a majority for what is left of it, then it goes (found by mutation testing)', async () => {
    const key = uniqueKey();
    const lock = await locks.acquire(key, { ttl: 5_000, holdAtLeast: 800 });
    const grantedAt = performance.now();
    assert.equal(await lock.release(), true);
    // Kept: another app cannot take it while the hold lasts, and every node's copy runs out by then.
    assert.equal(await other.locks.tryAcquire(key), null, 'taken before holdAtLeast was up');
    // The release resolves once a majority answered: a slower node's write lands a moment later
    // (a loaded CI run read one node before it: "a copy kept 4994 ms for an 800 ms hold").
    let lefts: number[] = [];
    assert.ok(
      await eventually(async () => {
        lefts = await Promise.all(direct.map((client) => client.pttl(`lock:{${key}}`)));
        return lefts.every((left) => left <= 800);
      }, 500),
      `copies kept ${lefts.join(', ')} ms for an 800 ms hold`,
    );
    const kept = lefts.filter((left) => left > 0).length;
    assert.ok(kept >= 3, `kept on ${kept} of ${NODES} nodes`);
    const taken = await other.locks.acquire(key, { acquireTimeout: 5_000 });
    assert.ok(performance.now() - grantedAt >= 790, 'taken before holdAtLeast was up');
    await taken.release();
  });

  it("inspect() reads what a majority of nodes holds: the lock, its TTL left, your own token's fence; also with two of five nodes paused", async () => {
    const key = uniqueKey();
    const own = await locks.acquire(key, { ttl: 5_000, token: `job-${key}` });
    const read = async (): Promise<void> => {
      const seen = await other.locks.inspect(key);
      assert.deepEqual(
        [seen.held, seen.mode, seen.holders, seen.fence],
        [true, 'exclusive', 1, own.fence],
      );
      assert.ok(seen.ttlLeft > 0 && seen.ttlLeft <= 5_000, `ttlLeft ${seen.ttlLeft}`);
    };
    await read();
    // The fence a majority of nodes record, not the first node's.
    const record = `lock:{${key}}:fence`;
    await direct[0].set(record, String(own.fence + 7), 'KEEPTTL');
    await read();
    await direct[0].set(record, String(own.fence), 'KEEPTTL');
    await pausing([1, 3], read);
    // ttlLeft: until fewer than a majority hold it. With the copies of the three nodes that
    // answer running out at 2, 3 and 4 s, that is 2 s (the third longest), not 4.
    await Promise.all(
      [0, 2, 4].map((node, i) => direct[node].pexpire(`lock:{${key}}`, 2_000 + i * 1_000)),
    );
    const left = (await pausing([1, 3], () => other.locks.inspect(key))).ttlLeft;
    assert.ok(left > 1_000 && left <= 2_000, `ttlLeft ${left}: not the third longest copy's`);
    // A copy on a minority of nodes is no lock.
    await own.release();
    await direct[2].set(`lock:{${key}}`, 'a-stray-copy', 'PX', 5_000);
    assert.deepEqual(await other.locks.inspect(key), {
      held: false,
      mode: null,
      holders: 0,
      ttlLeft: 0,
      fence: null,
      waiting: 0,
    });
    await direct[2].del(`lock:{${key}}`);
  });

  it("a generated token's grants agree on their fence in one round: each attempt proposes a floor from its process's clock and the lead the nodes showed, so no second round is sent (2 scripts per lock on each node, not 3); a node's counter ahead costs one second round, then none", async () => {
    const mine = await startLockModule({ nodes: servers.map((server) => server.url) });
    try {
      /** `n` locks one after another: the scripts each node ran for them, and their fences. */
      const locksInARow = async (n: number): Promise<{ scripts: number[]; fences: number[] }> => {
        const before = await scriptsRunOn(direct);
        const fences: number[] = [];
        for (let i = 0; i < n; i++) {
          const lock = await mine.locks.acquire(uniqueKey());
          fences.push(lock.fence);
          assert.equal(await lock.release(), true);
        }
        const after = await scriptsRunOn(direct);
        return { scripts: after.map((count, i) => count - before[i]), fences };
      };
      const increasing = (fences: number[]): boolean =>
        fences.every((fence, i) => i === 0 || fence > fences[i - 1]);
      await locksInARow(5); // connected, scripts loaded, the lead learned
      const { scripts, fences } = await locksInARow(50);
      assert.ok(increasing(fences), `fences ${fences.join(', ')}`);
      // The grant and the release on each node (a node may miss a release it was not needed for:
      // the call returns at a majority), a few more for other tests' work in flight.
      for (const count of scripts)
        assert.ok(count <= 2 * 50 + 3, `scripts per node: ${scripts.join(', ')}`);
      // A node's counter 1,000 s ahead: its fence is the holder's, the others are raised to it in
      // a second round once, and the floors are above it from then on.
      const [seconds] = await direct[0].time();
      await direct[0].set(
        'lock:{}:counter',
        String((Number(seconds) + 1_000) * 1_000_000),
        'KEEPTTL',
      );
      const ahead = await locksInARow(50);
      assert.ok(ahead.fences[0] > (Number(seconds) + 1_000) * 1_000_000, 'the counter ahead');
      assert.ok(increasing([...fences, ...ahead.fences]), `fences ${ahead.fences.join(', ')}`);
      for (const count of ahead.scripts) {
        assert.ok(count <= 2 * 50 + 1 + 3, `scripts per node: ${ahead.scripts.join(', ')}`);
      }
    } finally {
      await mine.close();
    }
  });

  it("forceRelease() whose nodes' fences differ: its fence is the highest, and a second round brings a majority's counters to it, so the next holder's is above it on any majority (found by mutation testing)", async () => {
    const key = uniqueKey();
    const lock = await heldWithFencesApart(key);
    const freed = await other.locks.forceRelease(key, { reason: 'test: fences apart' });
    assert.ok(freed.fence > lock.fence, `the force's fence ${freed.fence} below ${lock.fence}`);
    // The next holder on the three that had lost it: above the force's all the same.
    const next = await pausing([0, 1], () => other.locks.acquire(key, { acquireTimeout: 5_000 }));
    try {
      assert.ok(next.fence > freed.fence, `the next fence ${next.fence} below ${freed.fence}`);
    } finally {
      await next.release();
    }
  });

  it("forceRelease() whose nodes' fences differ, over links of 130 ms each way: two rounds, within the bound of every Redlock call (2 × commandTimeout + 100 ms), the raise right before each node's release (found by a helper's script: three rounds, and the call timed out)", async () => {
    const proxies = await Promise.all(servers.map((server) => FaultProxy.start(() => server.port)));
    const slow = await startLockModule({
      nodes: proxies.map((proxy) => `redis://127.0.0.1:${proxy.port}`),
      commandTimeout: 300,
    });
    try {
      // Connected, the force's scripts loaded: no NOSCRIPT detour below.
      await slow.locks.forceRelease(uniqueKey(), { reason: 'test: warm-up' });
      const key = uniqueKey();
      const lock = await heldWithFencesApart(key);
      for (const proxy of proxies) proxy.setLatency(130);
      const watch = watchStalls();
      const started = performance.now();
      const freed = await slow.locks.forceRelease(key, { reason: 'test: slow links' });
      // Two round trips of 260 ms; a third (the raise, then the release) would pass 700.
      assertWithin(performance.now() - started, 2 * 300 + 100, watch, 'the force on slow links');
      watch.stop();
      assert.ok(freed.fence > lock.fence, `the force's fence ${freed.fence} below ${lock.fence}`);
      for (const proxy of proxies) proxy.setLatency(0);
      // Released on every node, and the next holder on the three that had lost their counter is
      // above the force all the same: each raise ran before its node's release.
      const held = (): Promise<number[]> =>
        Promise.all(direct.map((client) => client.exists(`lock:{${key}}`)));
      assert.ok(await eventually(async () => !(await held()).includes(1)));
      const next = await pausing([0, 1], () => other.locks.acquire(key, { acquireTimeout: 5_000 }));
      try {
        assert.ok(next.fence > freed.fence, `the next fence ${next.fence} below ${freed.fence}`);
      } finally {
        await next.release();
      }
    } finally {
      for (const proxy of proxies) proxy.heal();
      await slow.close();
      for (const proxy of proxies) await proxy.close();
    }
  });

  it("close() while a forceRelease() waits for its first round's answers: shutdown waits for the force's own release, so its hold is not left on the nodes (found by a helper's script: left on every node, 8 of 12)", async () => {
    const proxies = await Promise.all(servers.map((server) => FaultProxy.start(() => server.port)));
    const slow = await startLockModule({
      nodes: proxies.map((proxy) => `redis://127.0.0.1:${proxy.port}`),
    });
    let closed = false;
    try {
      await slow.locks.forceRelease(uniqueKey(), { reason: 'test: warm-up' });
      const key = uniqueKey();
      const held = await locks.acquire(key, { ttl: 10_000 });
      for (const proxy of proxies) proxy.setLatency(100);
      const forced = slow.locks
        .forceRelease(key, { reason: 'test: closing' })
        .catch((error: unknown) => error);
      await sleep(120); // the force has reached the nodes; their answers are on the way back
      await slow.close();
      closed = true;
      const freed = await forced;
      assert.ok(!(freed instanceof Error), String(freed));
      assert.deepEqual(
        await Promise.all(direct.map((client) => client.exists(`lock:{${key}}`))),
        [0, 0, 0, 0, 0],
        "the force's own hold was left on the nodes",
      );
      assert.equal(await held.release(), false);
    } finally {
      for (const proxy of proxies) proxy.heal();
      if (!closed) await slow.close();
      for (const proxy of proxies) await proxy.close();
    }
  });

  it('forceRelease() frees a lock on a majority with two of five nodes paused: its fence above the holder’s, below the next; with three paused, LockQuorumError (and it runs when they wake)', async () => {
    const key = uniqueKey();
    const lock = await locks.acquire(key, { ttl: 3_000, autoExtend: true });
    assert.ok(await eventually(async () => (await holders(key, lock.token)) === NODES));
    const freed = await pausing([1, 3], () =>
      other.locks.forceRelease(key, { reason: 'test: a hung holder' }),
    );
    assert.deepEqual([freed.mode, freed.holders], ['exclusive', 1]);
    assert.ok(freed.fence > lock.fence, `the force's fence ${freed.fence} above ${lock.fence}`);
    // The paused nodes run it as they wake: no copy of the freed holder is left anywhere.
    assert.ok(await eventually(async () => (await holders(key, lock.token)) === 0));
    // Free at once: the force released its own hold on a majority before it returned.
    const next = await other.locks.tryAcquire(key);
    assert.ok(next, "the key stayed taken after the force (its own hold's TTL)");
    assert.ok(
      next.fence > freed.fence,
      `the next holder's fence ${next.fence} above ${freed.fence}`,
    );
    assert.ok(await eventually(() => lock.signal.aborted, 3_000), 'the freed holder told');
    await next.release();
    // (Released on a majority; the last nodes' releases land a moment later.)
    assert.ok(await eventually(async () => (await holders(key, next.token)) === 0));

    // Nothing held: a force frees nothing (a copy on a minority is no lock).
    await direct[0].set(`lock:{${key}}`, 'a-stray-copy', 'PX', 5_000);
    const nothing = await other.locks.forceRelease(key, { reason: 'test: nothing held' });
    assert.deepEqual([nothing.mode, nothing.holders], [null, 0]);

    const kept = await locks.acquire(key, { ttl: 30_000 });
    assert.ok(
      await eventually(async () => (await holders(key, kept.token)) === NODES),
      `kept on every node: ${JSON.stringify(await Promise.all(direct.map((client) => client.get(`lock:{${key}}`))))}, kept ${kept.token}, freed ${lock.token}, next ${next.token}`,
    );
    const watch = watchStalls();
    const started = performance.now();
    const error = await pausing([0, 2, 4], () =>
      other.locks.forceRelease(key, { reason: 'test' }).catch((e: unknown) => e),
    );
    // One round that a majority leaves unanswered: the default commandTimeout (1 s), not a second
    // one for the force's own release.
    assertWithin(
      performance.now() - started,
      1_000,
      watch,
      'the force a majority leaves unanswered',
    );
    watch.stop();
    assert.ok(error instanceof LockBackendError, String(error));
    assert.equal(error.operation, 'forceRelease');
    assert.ok(error.cause instanceof LockQuorumError, String(error.cause));
    assert.equal(error.cause.timedOut, true);
    // Unanswered is not undone: the paused nodes run the force when they wake (a call that timed
    // out may still run, as the guide says), and the holder is freed after all.
    assert.ok(await eventually(async () => (await holders(key, kept.token)) === 0));
    assert.equal(await kept.release(), false);
  });

  it('a paused node (SIGSTOP) costs an acquisition and a release no time', async () => {
    const key = uniqueKey();
    await pausing([2], async () => {
      const watch = watchStalls();
      const started = performance.now();
      const lock = await locks.acquire(key);
      assert.equal(await lock.release(), true);
      const took = performance.now() - started;
      // Waiting for the paused node would cost commandTimeout (1 s) twice.
      assertWithin(took, 0, watch, 'acquire and release with a paused node');
      watch.stop();
    });
    // The paused node runs the queued release when it wakes: nothing is left behind.
    assert.ok(await eventually(async () => (await direct[2].exists(`lock:{${key}}`)) === 0));
  });

  it('a release that silent nodes leave undecided is a timeout (timedOut: true), as on one Redis (found by the model suite)', async () => {
    const key = uniqueKey();
    const lock = await locks.acquire(key, { ttl: 30_000 });
    assert.ok(await eventually(async () => (await holders(key, lock.token)) === NODES));
    // Two nodes lost the copy (restarted empty), two are silent: one yes, two no, two unknown.
    await Promise.all([2, 3].map((i) => direct[i].del(`lock:{${key}}`)));
    const error = await pausing([0, 1], () => lock.release().catch((e: unknown) => e));
    assert.ok(error instanceof LockBackendError, String(error));
    assert.ok(error.cause instanceof LockQuorumError, String(error.cause));
    assert.equal(error.cause.timedOut, true);
    assert.equal(error.cause.answered, 3, 'the one yes and the two no answered');
    assert.equal(error.timedOut, true, 'the outcome is unknown because nodes were silent');
    assert.ok(await eventually(async () => (await holders(key, lock.token)) === 0));
  });

  it('a paused majority fails an acquisition within commandTimeout, not at its deadline', async () => {
    const key = uniqueKey();
    const error = await pausing([0, 1, 2], async () => {
      const watch = watchStalls();
      const started = performance.now();
      const outcome = await locks.acquire(key, { acquireTimeout: 10_000 }).then(
        () => assert.fail('acquired without a majority'),
        (error: unknown) => error,
      );
      const took = performance.now() - started;
      assert.ok(took >= 900, `took ${took.toFixed(0)} ms`);
      assertWithin(took, 1_000, watch, 'acquire() with a paused majority (commandTimeout 1 s)');
      watch.stop();
      return outcome;
    });
    assert.ok(error instanceof LockBackendError && error.cause instanceof LockQuorumError);
    assert.match(error.cause.message, /no reply within commandTimeout/);
    // The paused nodes run the attempt when they wake; its late grants are undone there.
    for (const i of [0, 1, 2]) {
      assert.ok(await eventually(async () => (await direct[i].exists(`lock:{${key}}`)) === 0));
    }
  });

  it('nodes restarted empty while a lock is held: the holder keeps it while a majority still has it, and learns when not', async () => {
    const key = uniqueKey();
    const lock = await locks.acquire(key, { ttl: 30_000 });
    // Granted by the first three to answer; the other two follow.
    assert.ok(await eventually(async () => (await holders(key, lock.token)) === NODES));
    const signal = lock.signal;
    // Two nodes crash and come back without the lock: three still hold it, nobody else gets it.
    await (await crash([0, 1])).revive();
    assert.equal(await other.locks.tryAcquire(key), null);
    await sleep(300); // the holder's connections come back and it checks its locks
    assert.equal(signal.aborted, false);
    // A third node restarts empty before the TTL ran out: the majority is gone. Another app can
    // take the lock (why restarts must be delayed by the longest TTL, see the README), and the
    // holder's check after reconnecting tells it through its signal.
    await (await crash([2])).revive();
    const intruder = await other.locks.acquire(key, { acquireTimeout: 5_000 });
    assert.ok(
      await eventually(() => signal.aborted, 5_000),
      'the first holder learns it lost the lock',
    );
    assert.equal((signal.reason as LockLostError).reason, 'not-held');
    assert.equal(await lock.release(), false);
    await intruder.release();
  });

  it('an extension writes the copy back on nodes that restarted empty while a majority holds the lock: restarts must fall within one extension, not one lease', async () => {
    const key = uniqueKey();
    const lock = await locks.acquire(key, { ttl: 1_500, autoExtend: true });
    assert.ok(await eventually(async () => (await holders(key, lock.token)) === NODES));
    // Two nodes restart empty; the next extension (every 500 ms) gives them their copies back.
    await (await crash([0, 1])).revive();
    assert.ok(await eventually(async () => (await holders(key, lock.token)) === NODES, 3_000));
    // Two more restart: had the first two not got their copies back, the holder would be left on
    // one node of five, and another app could take the key.
    await (await crash([2, 3])).revive();
    assert.ok(await eventually(async () => (await holders(key, lock.token)) === NODES, 3_000));
    assert.equal(await other.locks.tryAcquire(key), null);
    assert.equal(lock.signal.aborted, false);
    assert.equal(await lock.release(), true);
    // The release is decided by a majority; the other nodes' releases follow.
    assert.ok(await eventually(async () => (await holders(key, lock.token)) === 0));
  });

  it('an extension never writes a copy back once the release has begun, nor for longer than the lease', async () => {
    const key = uniqueKey();
    const lock = await locks.acquire(key, { ttl: 10_000 });
    assert.ok(await eventually(async () => (await holders(key, lock.token)) === NODES));
    // Node 0 forgot the lock (as a node restarted empty) and answers slowly: its extension
    // reply comes after the release resolved.
    await direct[0].del(`lock:{${key}}`);
    await pausing([0], async () => {
      await lock.extend();
      assert.equal(await lock.release(), true);
      await sleep(300);
    });
    // Its late "not held" reply came; no copy of the released lock was written back.
    await sleep(200);
    assert.equal(await direct[0].exists(`lock:{${key}}`), 0, 'a copy of a released lock');
    // A copy written back before the release lasts no longer than the holder's lease.
    const next = await locks.acquire(key, { ttl: 30_000 });
    await direct[1].del(`lock:{${key}}`);
    const watch = watchStalls();
    await next.extend(30_000);
    assert.ok(await eventually(async () => (await direct[1].get(`lock:{${key}}`)) === next.token));
    // The copy's TTL is what is left of the lease when the write-back is sent, so it ends that
    // write's trip after the lease (as every TTL in Redis does: it starts when the command
    // arrives): a loaded gate run saw 31 ms ("the copy lives 1959 ms, the lease 1928 ms", against
    // a fixed 5). A copy given the whole TTL would end its drift margin (302 ms at 30 s) and more
    // after the lease: more than the machine's measured slack. The lease left is read before PTTL is sent, so that PTTL's own round trip
    // does not count against it.
    const lease = next.expiresAt - performance.now();
    const pttl = await direct[1].pttl(`lock:{${key}}`);
    const slack = watch.slack();
    watch.stop();
    assert.ok(
      pttl <= lease + slack,
      `the copy lives ${pttl} ms, the lease ${lease.toFixed(0)} ms (by more than the measured slack, ${slack.toFixed(0)} ms)`,
    );
    await next.release();
  });

  it("re-acquiring with one's own token keeps the fence whichever majority answers, also with the node that set it late", async () => {
    const key = uniqueKey();
    // Node 0's counter is far ahead: it sets the fence, the second round brings the others to it.
    const [seconds] = await direct[0].time();
    await direct[0].set(
      'lock:{}:counter',
      String((Number(seconds) + 1_000) * 1_000_000),
      'PX',
      60_000,
    );
    const first = await locks.acquire(key, { token: 'mine', ttl: 10_000 });
    assert.ok(await eventually(async () => (await holders(key, 'mine')) === NODES));
    // Node 0 answers late: the others' records decide.
    const again = await pausing([0], () => locks.acquire(key, { token: 'mine', ttl: 10_000 }));
    assert.equal(again.fence, first.fence, 'the fence changed with the majority that answered');
    // A node that forgot the lock gets it back at the next extension, its fence recorded with it.
    await direct[1].del(`lock:{${key}}`, `lock:{${key}}:fence`);
    await again.extend(10_000);
    assert.ok(await eventually(async () => (await direct[1].get(`lock:{${key}}`)) === 'mine'));
    const third = await pausing([0, 2], () => locks.acquire(key, { token: 'mine', ttl: 10_000 }));
    assert.equal(third.fence, first.fence);
    assert.equal(await third.release(), true);
    await direct[0].del('lock:{}:counter');
  });

  it("re-acquiring with one's own token keeps the fence when a node that lost its scripts granted after the raise round was sent (found by the model suite)", async () => {
    const key = uniqueKey();
    // Node 0 restarted empty: its scripts are gone, but a generated token's lock since loaded the
    // raise script there again. Frozen, it answers after the majority decided: its grant takes the
    // NOSCRIPT detour and reaches Redis after the raise meant for it.
    await direct[0].script('FLUSH');
    await direct[0].script('LOAD', RAISE_FENCE_SCRIPT);
    const first = await pausing([0], async () => {
      const lock = await locks.acquire(key, { token: 'late-node', ttl: 10_000 });
      await sleep(50); // the raise round went out to node 0 too
      return lock;
    });
    assert.ok(await eventually(async () => (await holders(key, 'late-node')) === NODES));
    await sleep(50);
    assert.equal(
      await direct[0].get(`lock:{${key}}:fence`),
      String(first.fence),
      "node 0 recorded a fence of its own over the holder's",
    );
    // A majority with node 0 in it answers the holder's fence.
    const again = await pausing([1, 2], () =>
      locks.acquire(key, { token: 'late-node', ttl: 10_000 }),
    );
    assert.equal(again.fence, first.fence);
    assert.equal(await again.release(), true);
  });

  it("another app re-acquiring with one's own token while a node's grant of it is still on its way keeps the fence (the node's own count is not the holder's)", async () => {
    const key = uniqueKey();
    // Nodes 1 to 4 count alike, ahead of the clock, node 0 further ahead: the first app's grant
    // agrees on nodes 1 to 4, node 0 (frozen) counts a fence of its own.
    const [seconds] = await direct[0].time();
    const ahead = (s: number) => String((Number(seconds) + s) * 1_000_000);
    await direct[0].set('lock:{}:counter', ahead(1_000), 'PX', 60_000);
    for (const i of [1, 2, 3, 4]) await direct[i].set('lock:{}:counter', ahead(500), 'PX', 60_000);
    await direct[0].script('LOAD', ACQUIRE_OWN_TOKEN_REDLOCK_SCRIPT); // no NOSCRIPT detour
    servers[0].signal('SIGSTOP');
    let frozen = [0];
    try {
      const first = await locks.acquire(key, { token: 'shared', ttl: 10_000 });
      // The other app re-acquires with nodes 1 and 2 frozen too: its majority is 0, 3 and 4. Node 0
      // wakes with the first grant queued ahead of the second: it records its own count there.
      for (const i of [1, 2]) servers[i].signal('SIGSTOP');
      frozen = [0, 1, 2];
      const again = other.locks.acquire(key, { token: 'shared', ttl: 10_000 });
      await sleep(100);
      servers[0].signal('SIGCONT');
      frozen = [1, 2];
      const second = await again;
      assert.equal(
        second.fence,
        first.fence,
        "node 0's own count was taken for the holder's fence",
      );
      for (const i of frozen) servers[i].signal('SIGCONT');
      frozen = [];
      assert.ok(await eventually(async () => (await holders(key, 'shared')) === NODES));
      assert.equal(await second.release(), true);
      assert.equal(await first.release(), false); // one lock, two handles: released already
    } finally {
      for (const i of frozen) servers[i].signal('SIGCONT');
      for (const client of direct) await client.del('lock:{}:counter');
    }
  });

  it("a failed re-acquisition with one's own token leaves the copies that token held: another instance's lock stays whole", async () => {
    const key = uniqueKey();
    const held = await locks.acquire(key, { token: 'held-elsewhere', ttl: 30_000 });
    assert.ok(await eventually(async () => (await holders(key, 'held-elsewhere')) === NODES));
    // The other app tries with the same token while three nodes freeze beyond its validity: no
    // majority in time, so the attempt fails, and its undo meets copies the token held already.
    const attempt = pausing([0, 1, 2], async () => {
      const tried = other.locks
        .tryAcquire(key, { token: 'held-elsewhere', ttl: 300 })
        .catch((error: unknown) => error);
      await sleep(400);
      return tried;
    });
    const outcome = await attempt;
    assert.ok(outcome === null || outcome instanceof Error, `got ${String(outcome)}`);
    await sleep(300); // the frozen nodes' replies, and any undo, are in by now
    assert.equal(await holders(key, 'held-elsewhere'), NODES, "the holder's copies were deleted");
    assert.equal(held.signal.aborted, false);
    assert.equal(await other.locks.tryAcquire(key), null, 'another caller got the key');
    assert.equal(await held.release(), true);
  });

  it('a release does not overtake its own attempt on a node that lost its scripts: no copy of the released lock is written back there', async () => {
    const key = uniqueKey();
    // Node 0 lost its scripts and has the release script again (another client used it since):
    // frozen, it answers the attempt after the majority decided, through the NOSCRIPT detour.
    await direct[0].script('FLUSH');
    await direct[0].script('LOAD', RELEASE_SCRIPT);
    const lock = await pausing([0], async () => {
      const taken = await locks.acquire(key, { ttl: 20_000 });
      assert.equal(await taken.release(), true);
      return taken;
    });
    await sleep(300); // the attempt's EVAL, and the release after it, are on their way
    // Converged once node 0 has run both (a copy written back would stay its 20 s TTL).
    assert.ok(
      await eventually(async () => (await direct[0].exists(`lock:{${key}}`)) === 0),
      'a copy of a released lock',
    );
    assert.equal(await holders(key, lock.token), 0);
  });

  it("copies of an own token's released lock that a release never reached (a minority) do not give that token its old fence back below a later holder's", async () => {
    const key = uniqueKey();
    const first = await locks.acquire(key, { token: 'came-back', ttl: 30_000 });
    assert.ok(await eventually(async () => (await holders(key, 'came-back')) === NODES));
    assert.equal(await first.release(), true);
    // Nodes 3 and 4 never got that release (cut off until their copies' TTL): their copies, and
    // the fence recorded with them, stay.
    for (const i of [3, 4]) {
      await direct[i].set(`lock:{${key}}`, 'came-back', 'PX', 30_000);
      await direct[i].set(`lock:{${key}}:fence`, String(first.fence), 'PX', 30_000);
    }
    const between = await other.locks.acquire(key); // on nodes 0 to 2
    assert.ok(between.fence > first.fence);
    assert.equal(await between.release(), true);
    // The token again, answered by nodes 2, 3 and 4: two of them still have its copy.
    const again = await pausing([0, 1], () => locks.acquire(key, { token: 'came-back' }));
    assert.ok(
      again.fence > between.fence,
      `fence ${again.fence}, not above ${between.fence} granted in between`,
    );
    assert.equal(await again.release(), true);
  });

  it("re-acquiring with one's own token keeps the fence when a node of the majority that answers restarted empty (the other nodes still hold it)", async () => {
    const key = uniqueKey();
    const first = await locks.acquire(key, { token: 'survivor', ttl: 30_000 });
    assert.ok(await eventually(async () => (await holders(key, 'survivor')) === NODES));
    const node0 = await crash([0]);
    await node0.revive();
    // Node 1 frozen: node 0 (empty) answers with a new fence, three others that the token holds
    // the lock, a majority. (With two frozen, only two would show it: not a majority, so the
    // re-acquisition could not tell these copies from ones a release never reached, and gets a
    // new fence; see the test above.)
    const again = await pausing([1], () => locks.acquire(key, { token: 'survivor' }));
    assert.equal(again.fence, first.fence);
    assert.equal(await again.release(), true);
  });

  it('decides each round as soon as its outcome is known: two frozen nodes of five cost a grant, a refusal, an extension, a release and a round that failures and a refusal decide no time', async () => {
    // Apps of their own with a long commandTimeout: waiting for a frozen node would take all of
    // it (4 s), far above what a loaded machine adds to a round of live nodes.
    const commandTimeout = 4_000;
    const nodes = servers.map((server) => server.url);
    const mine = await startLockModule({ nodes, commandTimeout });
    const theirs = await startLockModule({ nodes, commandTimeout });
    try {
      const key = uniqueKey();
      const held = await theirs.locks.acquire(key, { ttl: 10_000 });
      assert.ok(await eventually(async () => (await holders(key, held.token)) === NODES));
      const times: [string, number][] = [];
      const timed = async <T>(what: string, call: () => Promise<T>): Promise<T> => {
        const started = performance.now();
        const value = await call();
        times.push([what, performance.now() - started]);
        return value;
      };
      const watch = watchStalls();
      await pausing([3, 4], async () => {
        // Three nodes answer that someone else holds it: no majority can say yes any more.
        assert.equal(await timed('refusal', () => mine.locks.tryAcquire(key)), null);
        assert.equal(await timed('release', () => held.release()), true);
        const lock = await timed('grant', () => mine.locks.acquire(key, { ttl: 10_000 }));
        await timed('extension', () => lock.extend(10_000));
        assert.equal(await lock.release(), true);
        // Two nodes fail at once (out of memory: the attempt's write is refused), one says no:
        // no majority can say yes any more, whatever the frozen two would answer.
        const other = uniqueKey();
        await direct[2].set(`lock:{${other}}`, 'someone else', 'PX', 10_000);
        await Promise.all([0, 1].map((i) => direct[i].config('SET', 'maxmemory', '1')));
        try {
          // Busy, as a refusal by a minority with the rest failed is (no majority of failures).
          assert.equal(
            await timed('failures and a refusal', () => mine.locks.tryAcquire(other)),
            null,
          );
        } finally {
          await Promise.all([0, 1].map((i) => direct[i].config('SET', 'maxmemory', '0')));
          await direct[2].del(`lock:{${other}}`);
        }
      });
      const stalled = watch.stop();
      for (const [what, ms] of times) {
        assert.ok(
          ms < commandTimeout / 2 + stalled,
          `${what}: ${ms.toFixed(0)} ms (event loop stalled ${stalled.toFixed(0)} ms)`,
        );
      }
    } finally {
      await mine.close();
      await theirs.close();
    }
  });

  it("a failed attempt's undo is announced as one release, with one id on every node, where it frees a node a majority could use; not where a majority refused it", async () => {
    const key = uniqueKey();
    const held = await locks.acquire(key, { ttl: 10_000 });
    assert.ok(await eventually(async () => (await holders(key, held.token)) === NODES));
    const heard: string[] = [];
    const listeners = [3, 4].map((i) => direct[i].duplicate().on('error', () => {}));
    const { freeze, thaw } = freezer();
    try {
      for (const listener of listeners) {
        listener.on('message', (_channel: string, message: string) => heard.push(message));
        await listener.subscribe(`lock:{${key}}:released`);
      }
      // Nodes 3 and 4 forgot it: another app's attempt gets those two, and the other three, a
      // majority, refuse it. Its undo frees nothing anyone could take: it says nothing (found by
      // a reviewer's script: announced, it woke the waiters, whose attempts failed and were
      // undone in turn, thousands a second).
      for (const i of [3, 4]) await direct[i].del(`lock:{${key}}`);
      assert.equal(await other.locks.tryAcquire(key), null);
      assert.ok(
        await eventually(async () => (await holders(key, held.token, [3, 4].values())) === 0),
      );
      for (const i of [3, 4]) {
        assert.equal(await direct[i].exists(`lock:{${key}}`), 0, `the undo left node ${i}`);
        // Published after the undo on that node: heard after anything the undo announced there.
        await direct[i].publish(`lock:{${key}}:released`, 'marker');
      }
      assert.ok(await eventually(() => heard.length >= 2), `heard ${heard.length}`);
      assert.deepEqual(heard.splice(0), ['marker', 'marker'], 'a quiet undo announced');
      // Node 2 forgot it too, and does not answer: two refusals, two grants, one silent node. The
      // undo frees nodes 3 and 4, which with node 2 are a majority: it wakes whoever waits.
      await direct[2].del(`lock:{${key}}`);
      freeze(2);
      assert.equal(await other.locks.tryAcquire(key), null);
      assert.ok(await eventually(() => heard.length === 2), `heard ${heard.length}`);
      assert.notEqual(heard[0], '', 'an empty message wakes waiters once per node');
      assert.equal(heard[0], heard[1]);
    } finally {
      thaw();
      for (const listener of listeners) listener.disconnect();
      await held.release();
    }
  });

  for (const outOfMemory of [false, true]) {
    it(`waiters behind a holder whose copy ${outOfMemory ? 'two nodes lost, a third node out of memory' : 'one node lost'} do not spin: each failed attempt's undo is quiet, so they poll (found by ${outOfMemory ? "a helper's script: 1,200 to 4,000 scripts a second, the node's refusal not counted" : "a reviewer's script: thousands of attempts a second"})`, async () => {
      const key = uniqueKey();
      const held = await locks.acquire(key, { ttl: 10_000, autoExtend: false });
      assert.ok(await eventually(async () => (await holders(key, held.token)) === NODES));
      for (const i of [3, 4]) await direct[i].del(`lock:{${key}}`);
      // Out of memory, node 2 answers every script with an error at once: a refusal.
      if (outOfMemory) await direct[2].config('SET', 'maxmemory', '1');
      const scripts = async (): Promise<number> => (await scriptsRunOn([direct[0]]))[0];
      const waiters = [app, other].map((fixture) =>
        fixture.locks.acquire(key, { ttl: 1_000, acquireTimeout: 10_000 }),
      );
      try {
        await sleep(200); // each has tried, failed and undone its copies on nodes 3 and 4
        const before = await scripts();
        await sleep(1_000);
        const sent = (await scripts()) - before;
        // Each waiter asks again every retryInterval at most (with its jitter): a few a second.
        assert.ok(sent < 50, `${sent} scripts in 1 s on node 0 while two waiters waited`);
      } finally {
        await direct[2].config('SET', 'maxmemory', '0');
        await held.release();
        for (const lock of await Promise.all(waiters)) await lock.release();
      }
    });
  }

  it('shutdown waits for the undo of a failed attempt whose copy a paused node grants late (found by the model suite)', async () => {
    const key = uniqueKey();
    const held = await other.locks.acquire(key, { ttl: 10_000 });
    assert.ok(await eventually(async () => (await holders(key, held.token)) === NODES));
    // Free on nodes 3 and 4: a third app's attempt gets node 4 at once and node 3 when it wakes.
    await direct[3].del(`lock:{${key}}`);
    await direct[4].del(`lock:{${key}}`);
    const third = await startLockModule({ nodes: servers.map((server) => server.url) });
    let closed = false;
    try {
      servers[3].signal('SIGSTOP');
      assert.equal(await third.locks.tryAcquire(key, { ttl: 30_000 }), null);
      setTimeout(() => servers[3].signal('SIGCONT'), 300);
      await third.close();
      closed = true;
      assert.equal(await direct[3].exists(`lock:{${key}}`), 0, 'the late copy was never undone');
      assert.equal(await direct[4].exists(`lock:{${key}}`), 0);
    } finally {
      servers[3].signal('SIGCONT');
      if (!closed) await third.close();
      await held.release();
    }
  });

  it("a split vote (the nodes that refused name holders, none of which holds a majority) is tried again within retryJitter, not at the next poll; a holder's majority is waited for (found by a helper's script: the key stayed free ~1 s after each split)", async () => {
    const key = uniqueKey();
    const name = `lock:{${key}}`;
    // Other waiters' attempts, each on some nodes (a on 0 and 1, b on 2): the next attempt gets 3
    // and 4, and is refused by three nodes, no two of them one holder's majority.
    await Promise.all([0, 1].map((i) => direct[i].set(name, 'waiter-a', 'PX', 10_000)));
    await direct[2].set(name, 'waiter-b', 'PX', 10_000);
    const ran = async (): Promise<number> => (await scriptsRunOn([direct[3]]))[0];
    const ranBefore = await ran();
    const pending = locks.acquire(key, { ttl: 5_000, acquireTimeout: 5_000 });
    // Its first two attempts (the second once it listens for releases) and their undos ran on
    // node 3: from here on it is told nothing, and tries again at its own pace.
    assert.ok(await eventually(async () => (await ran()) >= ranBefore + 4, 1_000));
    // Their undos (no announcement: a majority refused them, too).
    const watch = watchStalls();
    await Promise.all([0, 1, 2].map((i) => direct[i].del(name)));
    const freed = performance.now();
    const lock = await pending;
    // Within a few tries of ≤ 50 ms jitter (10 and 30 ms more after splits in a row), not at
    // retryInterval (1 s), plus what the machine stalled meanwhile.
    assertWithin(performance.now() - freed, 300, watch, 'the split attempt trying again');
    watch.stop();
    await lock.release();

    // A holder on three nodes (its copies on 3 and 4 lost): the attempt waits for its release.
    const holder = await other.locks.acquire(key, { ttl: 10_000 });
    for (const i of [3, 4]) await direct[i].del(name);
    const before = (await scriptsRunOn([direct[0]]))[0];
    const waiting = locks.acquire(key, { ttl: 5_000, acquireTimeout: 5_000 });
    await sleep(500);
    const tried = (await scriptsRunOn([direct[0]]))[0] - before;
    assert.ok(tried <= 3, `${tried} attempts in 500 ms behind a holder's majority`);
    await holder.release();
    await (await waiting).release();
  });

  it("split votes in a row back off (10, 30, 70 ms… up to retryInterval): copies nobody undoes (their processes died mid-split) are not asked about 40 times a second by every waiter (found by a helper's script: 150 scripts a second per process)", async () => {
    const key = uniqueKey();
    const name = `lock:{${key}}`;
    // Two dead waiters' copies, two nodes each: every attempt gets node 4 only, a split.
    await Promise.all([0, 1].map((i) => direct[i].set(name, 'dead-a', 'PX', 3_000)));
    await Promise.all([2, 3].map((i) => direct[i].set(name, 'dead-b', 'PX', 3_000)));
    const waiters = [locks, other.locks].map((service) =>
      service.acquire(key, { ttl: 1_000, acquireTimeout: 6_000 }),
    );
    try {
      await sleep(100);
      const before = (await scriptsRunOn([direct[0]]))[0];
      await sleep(1_000);
      const asked = (await scriptsRunOn([direct[0]]))[0] - before;
      assert.ok(asked < 30, `${asked} attempts in 1 s by two waiters behind a split that stays`);
    } finally {
      // Both get the key once the copies run out (the second at the first's release).
      await Promise.all(waiters.map(async (waiting) => (await waiting).release()));
    }
  });

  it('a refusal says the key is busy and when to try again: the least TTL the nodes that refused have left (found by mutation testing)', async () => {
    const key = uniqueKey();
    const held = await other.locks.acquire(key, { ttl: 30_000 });
    assert.ok(await eventually(async () => (await holders(key, held.token)) === NODES));
    // Each node's copy with a TTL of its own: the refusal names the least TTL among the nodes
    // whose refusals decided it (any three of five, whichever answer first). Three copies end
    // within 3 s, two after 12 s: any three nodes include a short one, so the least is at most
    // 3 s, where the most would be 12 s unless the first three were exactly the short ones: the
    // last three asked (the first nodes, asked first, mostly answer first).
    const ttls = [12_000, 17_000, 2_000, 2_500, 3_000];
    for (const [i, client] of direct.entries()) await client.pexpire(`lock:{${key}}`, ttls[i]);
    const error = await locks.acquire(key, { acquireTimeout: 0 }).catch((e: unknown) => e);
    assert.ok(error instanceof LockAcquireTimeoutError, String(error));
    assert.equal(error.busy, true);
    const retryAfter = error.retryAfterMs;
    assert.ok(
      retryAfter !== undefined && retryAfter > 1_000 && retryAfter <= 3_000,
      `retryAfterMs ${retryAfter}`,
    );
    await held.release();
  });

  it("a paused minority costs an acquisition no time: a fresh lock, and one's own token taken again (found by mutation testing)", async () => {
    const key = uniqueKey();
    const own = await locks.acquire(key, { token: `own-${key}`, ttl: 10_000 });
    assert.ok(await eventually(async () => (await holders(key, own.token)) === NODES));
    const fresh = uniqueKey();
    await pausing([1, 3], async () => {
      const watch = watchStalls();
      for (const [what, call] of [
        ['a fresh lock', () => locks.acquire(fresh)],
        // Found on the three nodes that answer: a majority, so the other two are not waited for.
        ['the own token again', () => locks.acquire(key, { token: own.token, ttl: 10_000 })],
      ] as const) {
        const started = performance.now();
        const lock = await call();
        // A quarter of the paused nodes' commandTimeout (1 s), which waiting for them would take.
        assertWithin(
          performance.now() - started,
          250,
          watch,
          `${what} with two of five nodes paused`,
        );
        await lock.release();
      }
      watch.stop();
    });
  });

  it('a key left without a TTL on every node (not ours): the refusal is busy and names no time to wait (found by mutation testing)', async () => {
    const key = uniqueKey();
    for (const client of direct) await client.set(`lock:{${key}}`, 'stray');
    try {
      const error = await locks.acquire(key, { acquireTimeout: 0 }).catch((e: unknown) => e);
      assert.ok(error instanceof LockAcquireTimeoutError, String(error));
      assert.deepEqual([error.busy, error.retryAfterMs], [true, undefined]);
    } finally {
      for (const client of direct) await client.del(`lock:{${key}}`);
    }
  });

  it("re-acquiring with one's own token keeps the fence when the first nodes to answer had lost it: the others' answers are waited for (found by mutation testing)", async () => {
    const key = uniqueKey();
    const first = await locks.acquire(key, { token: 'kept', ttl: 30_000 });
    assert.ok(await eventually(async () => (await holders(key, 'kept')) === NODES));
    // Nodes 0 and 1 lost the lock and its record (emptied); nodes 2, 3 and 4 hold it. With 3 and
    // 4 frozen for a moment, the first majority to answer is 0, 1 and 2: one copy of three.
    for (const i of [0, 1]) await direct[i].del(`lock:{${key}}`, `lock:{${key}}:fence`);
    for (const i of [3, 4]) servers[i].signal('SIGSTOP');
    const thaw = setTimeout(() => {
      for (const i of [3, 4]) servers[i].signal('SIGCONT');
    }, 100);
    try {
      const again = await locks.acquire(key, { token: 'kept', ttl: 30_000 });
      assert.equal(
        again.fence,
        first.fence,
        'a new fence for a token that holds the lock on a majority',
      );
      assert.equal(await again.release(), true);
    } finally {
      clearTimeout(thaw);
      for (const i of [3, 4]) servers[i].signal('SIGCONT');
    }
  });

  it('an extension that finds the lock gone on a majority writes no copy back anywhere (found by mutation testing)', async () => {
    const key = uniqueKey();
    const lock = await locks.acquire(key, { ttl: 30_000 });
    assert.ok(await eventually(async () => (await holders(key, lock.token)) === NODES));
    for (const i of [0, 1, 2]) await direct[i].del(`lock:{${key}}`);
    await assert.rejects(lock.extend(30_000), LockLostError);
    await sleep(200); // a copy written back would have landed by now
    assert.equal(
      await holders(key, lock.token, [0, 1, 2].values()),
      0,
      'a lost lock was written back',
    );
    assert.equal(await lock.release(), false);
  });

  it('two extensions whose write-backs are on their way: once the first is over, a release still stops the second (found by mutation testing)', async () => {
    // An app of its own whose replies are bounded by 1 s: the first extension's write-back ends
    // when node 0 has not answered within it, the second's is still on its way at the release.
    const commandTimeout = 1_000;
    const mine = await startLockModule({
      nodes: servers.map((server) => server.url),
      commandTimeout,
    });
    try {
      for (let attempt = 1; ; attempt++) {
        const key = uniqueKey();
        const lock = await mine.locks.acquire(key, { ttl: 30_000 });
        assert.ok(await eventually(async () => (await holders(key, lock.token)) === NODES));
        // Node 0 forgot the lock (as a node restarted empty), and answers once the release is made.
        await direct[0].del(`lock:{${key}}`);
        let secondSent = 0;
        await pausing([0], async () => {
          const firstSent = performance.now();
          await lock.extend(); // a majority extends; node 0's "not held" is awaited for its write-back
          await sleep(600);
          secondSent = performance.now();
          await lock.extend();
          // The first write-back gave node 0 up; the second still waits for its answer.
          await sleep(Math.max(0, firstSent + commandTimeout + 50 - performance.now()));
          assert.equal(await lock.release(), true);
        });
        // Node 0 answers both extensions now: not held. The second's answer must come within its
        // bound, or it says nothing of the release (a stalled machine: try again).
        const answered = performance.now() - secondSent < commandTimeout - 100;
        await sleep(300); // a copy written back would have landed by now
        assert.equal(await direct[0].exists(`lock:{${key}}`), 0, 'a copy of a released lock');
        if (answered) break;
        assert.ok(attempt < 3, 'node 0 never answered the second extension within its bound');
      }
    } finally {
      await mine.close();
    }
  });

  it("a release stops its own lock's write-back when an earlier lock of the same own token ended its last one after it began (found by mutation testing)", async () => {
    // An app of its own whose replies are bounded by 1 s. The first lock's write-back waits for
    // frozen node 0 and ends at that bound, after the second lock's began on frozen node 1: the
    // second's release must still stop it.
    const commandTimeout = 1_000;
    const mine = await startLockModule({
      nodes: servers.map((server) => server.url),
      commandTimeout,
    });
    const { freeze, thaw } = freezer();
    try {
      for (let attempt = 1; ; attempt++) {
        const key = uniqueKey();
        const token = `own-${key}`;
        const first = await mine.locks.acquire(key, { ttl: 30_000, token });
        assert.ok(await eventually(async () => (await holders(key, token)) === NODES));
        await direct[0].del(`lock:{${key}}`); // forgotten there, as by a node restarted empty
        let secondSent = 0;
        try {
          freeze(0);
          const firstSent = performance.now();
          await first.extend(); // nodes 1–4; node 0's "not held" awaited for its write-back
          assert.equal(await first.release(), true);
          const second = await mine.locks.acquire(key, { ttl: 30_000, token, acquireTimeout: 0 });
          assert.ok(await eventually(async () => (await direct[1].get(`lock:{${key}}`)) === token));
          await direct[1].del(`lock:{${key}}`);
          freeze(1);
          // Halfway through the first write-back's bound: the second's ends well after it.
          await sleep(Math.max(0, firstSent + commandTimeout / 2 - performance.now()));
          secondSent = performance.now();
          await second.extend(); // nodes 2–4; node 1's "not held" awaited for its write-back
          // The first lock's write-back gives node 0 up; the second's still waits for node 1.
          await sleep(Math.max(0, firstSent + commandTimeout + 50 - performance.now()));
          assert.equal(await second.release(), true);
        } finally {
          thaw();
        }
        // Node 1 answers now: not held. That answer must come within its bound, or it says
        // nothing of the release (a stalled machine: try again).
        const answered = performance.now() - secondSent < commandTimeout - 100;
        await sleep(300); // a copy written back would have landed by now
        assert.equal(await direct[1].exists(`lock:{${key}}`), 0, 'a copy of a released lock');
        if (answered) break;
        assert.ok(attempt < 3, 'node 1 never answered the extension within its bound');
      }
    } finally {
      thaw();
      await mine.close();
    }
  });

  it("a failed attempt with a caller's own token that a majority refused undoes the copies it wrote: a holder's write-back finds the node free, so restarts do not add up behind a waiting own token (found by a helper's script: kept, they gave the waiter the key beside the live holder after a second restart, 6 of 9)", async () => {
    const key = uniqueKey();
    const holder = await locks.acquire(key, { ttl: 10_000, autoExtend: false });
    assert.ok(await eventually(async () => (await holders(key, holder.token)) === NODES));
    // Two nodes lose the holder's copy (restarted empty): it keeps nodes 0 to 2.
    for (const i of [3, 4]) await direct[i].del(`lock:{${key}}`);
    const token = `own-${key}`;
    for (let attempt = 0; attempt < 3; attempt++) {
      assert.equal(await other.locks.tryAcquire(key, { token, ttl: 10_000 }), null);
      // The copies it got on nodes 3 and 4 are undone (with their records).
      assert.ok(
        await eventually(async () => (await holders(key, token)) === 0, 1_000),
        `attempt ${attempt}: the waiter's copies stayed on ${await holders(key, token)} node(s)`,
      );
      assert.equal(await direct[3].exists(`lock:{${key}}:fence`), 0);
    }
    // The holder's extension writes its copies back where the key is free.
    await holder.extend();
    assert.ok(
      await eventually(async () => (await holders(key, holder.token)) === NODES),
      'the holder was not written back on nodes 3 and 4',
    );
    assert.equal(await holder.release(), true);
  });

  it("a failed attempt with a caller's own token leaves the copies it wrote that another instance with the token re-took and settled meanwhile (found by a helper's script: undone, a third caller got the key beside that holder, 10 of 10)", async () => {
    // An instance whose links add 150 ms each way: its grant of a 250 ms lease comes back after
    // the lease, and its attempt fails. Meanwhile another instance takes the same token, re-taking
    // the copies that attempt wrote.
    const proxies = await Promise.all(servers.map((server) => FaultProxy.start(() => server.port)));
    const slow = await startLockModule({
      nodes: proxies.map((proxy) => `redis://127.0.0.1:${proxy.port}`),
    });
    try {
      await (await slow.locks.acquire(uniqueKey())).release(); // connected, scripts loaded
      for (const proxy of proxies) proxy.setLatency(150);
      const key = uniqueKey();
      const token = `own-${key}`;
      const failing = slow.locks
        .acquire(key, { token, ttl: 250, acquireTimeout: 0 })
        .catch((error: unknown) => error);
      assert.ok(
        await eventually(async () => (await holders(key, token)) >= 3, 1_000),
        "the slow attempt's copies never reached a majority",
      );
      const holder = await other.locks.acquire(key, { token, ttl: 10_000, acquireTimeout: 0 });
      assert.ok((await failing) instanceof Error, 'the slow attempt got its late lease');
      await sleep(400); // an undo of the slow attempt's copies would have landed by now
      assert.equal(await holders(key, token), NODES, "the holder's copies were undone");
      assert.equal(await locks.tryAcquire(key), null, 'a third caller got the key beside it');
      assert.equal(holder.signal.aborted, false);
      assert.equal(await holder.release(), true);
    } finally {
      for (const proxy of proxies) proxy.heal();
      await slow.close();
      for (const proxy of proxies) await proxy.close();
    }
  });

  it("every announcement of a process carries an id of its own, releases' and undos' alike (a waiter takes a repeat for one it heard: found by mutation testing)", async () => {
    const key = uniqueKey();
    const freed = uniqueKey();
    const backendId = (locks as unknown as { engine: { backend: { id: string } } }).engine.backend
      .id;
    const monitor = await monitorRedis(servers[3].port);
    const { freeze, thaw } = freezer();
    try {
      // Held on nodes 0 and 1 only, node 2 silent: an attempt of `locks` takes nodes 3 and 4,
      // fails (at commandTimeout, for node 2's answer), and undoes them, announced: with node 2
      // they could be a majority (an undo that a majority refused frees nothing, and is quiet).
      const held = await other.locks.acquire(key, { ttl: 30_000 });
      assert.ok(await eventually(async () => (await holders(key, held.token)) === NODES));
      for (const i of [2, 3, 4]) await direct[i].del(`lock:{${key}}`);
      freeze(2);
      const failAndUndo = async (): Promise<void> => {
        assert.equal(await locks.tryAcquire(key), null);
        assert.ok(
          await eventually(async () =>
            (await Promise.all([3, 4].map((i) => direct[i].exists(`lock:{${key}}`)))).every(
              (n) => n === 0,
            ),
          ),
          'never undone',
        );
      };
      // Undos and releases, one after another.
      for (let round = 0; round < 2; round++) {
        await failAndUndo();
        await failAndUndo();
        await (await locks.acquire(freed)).release();
      }
      thaw();
      await held.release();
      await monitor.caughtUp();
      const messages = monitor.commands
        .filter(({ args }) => args[0] === 'publish' && args[2].startsWith(`${backendId}:`))
        .map(({ args }) => args[2]);
      assert.equal(messages.length, 6, `announcements on node 3: ${messages.join(', ')}`);
      assert.equal(new Set(messages).size, 6, `repeated: ${messages.join(', ')}`);
    } finally {
      thaw();
      monitor.stop();
    }
  });

  it('keeps no record of attempts or write-backs once they are over (found by mutation testing)', async () => {
    const backend = (
      locks as unknown as {
        engine: { backend: { attempts: Map<string, number>; writeBacks: Map<string, unknown> } };
      }
    ).engine.backend;
    const key = uniqueKey();
    for (let i = 0; i < 3; i++) await (await locks.acquire(key)).release();
    // (A release returns once a majority has released: the last nodes' releases may still be on
    // their way, and a grant that got there first would be refused there. Failed under load.)
    const free = async (): Promise<boolean> =>
      (await Promise.all(direct.map((client) => client.exists(`lock:{${key}}`)))).every(
        (n) => n === 0,
      );
    assert.ok(await eventually(free), 'the releases never reached every node');
    // A refused attempt (undone nowhere: it got no copy), and one with copies on a minority.
    const held = await other.locks.acquire(key, { ttl: 30_000 });
    // (Granted once a majority answered: the others' copies may still be on their way.)
    assert.ok(await eventually(async () => (await holders(key, held.token)) === NODES));
    assert.equal(await locks.tryAcquire(key), null);
    for (const i of [0, 1]) await direct[i].del(`lock:{${key}}`);
    assert.equal(await locks.tryAcquire(key), null);
    await held.release();
    // (The refused attempt's copies on nodes 0 and 1 are undone once it is answered: until then
    // the next lock would hold on a majority without them, and never on every node. Failed in CI.)
    assert.ok(await eventually(free), 'the refused attempt was never undone');
    // An extension that writes a copy back.
    const lock = await locks.acquire(key, { ttl: 30_000 });
    assert.ok(await eventually(async () => (await holders(key, lock.token)) === NODES));
    await direct[0].del(`lock:{${key}}`);
    await lock.extend(30_000);
    assert.ok(await eventually(async () => (await direct[0].get(`lock:{${key}}`)) === lock.token));
    await lock.release();
    assert.ok(
      await eventually(() => backend.attempts.size === 0 && backend.writeBacks.size === 0, 2_000),
      `left: ${backend.attempts.size} attempts, ${backend.writeBacks.size} write-backs`,
    );
  });

  it('no lock from a second round a majority refuses: the copies its first round left on a minority are undone, and the call tries again (found by mutation testing)', async () => {
    // Three nodes whose replies are held: their grants are made, and deleted (lost, as a restart
    // loses them) before the call hears of them. Its first round then has a majority whose fences
    // differ (nodes 2 to 4's counters pushed ahead of the floor the others answer), so it sends the
    // second round, the raise, which finds the token no longer holding on a majority. No timing:
    // the order is the test's.
    const proxies = await Promise.all(
      [2, 3, 4].map((i) => FaultProxy.start(() => servers[i].port)),
    );
    const slow = await startLockModule({
      nodes: [
        ...servers.slice(0, 2).map((server) => server.url),
        ...proxies.map((proxy) => `redis://127.0.0.1:${proxy.port}`),
      ],
      // Room for the test's steps while the replies are held: an attempt given up at its bound
      // would make the call that may not wait fail with LockBackendError instead.
      commandTimeout: 5_000,
    });
    try {
      // Connected, the acquisition's script loaded on every node (a NOSCRIPT held back would
      // keep the grant from running), before the replies are held.
      await (await slow.locks.acquire(uniqueKey())).release();
      // A call that may wait tries again; one that may not fails, saying nobody held the key.
      for (const acquireTimeout of [5_000, 0]) {
        // (Every majority holds one of nodes 2 to 4: with only node 2 ahead, a majority of
        // nodes 0, 1 and 3 answered the floor alike and took no second round, 1 in 3 full runs.)
        await Promise.all([2, 3, 4].map((i) => direct[i].incrby('lock:{}:counter', 1e12 * i)));
        for (const proxy of proxies) proxy.holdReplies();
        const key = uniqueKey();
        const pending = slow.locks
          .acquire(key, { ttl: 10_000, acquireTimeout })
          .catch((error: unknown) => error);
        for (const i of [2, 3, 4]) {
          assert.ok(
            await eventually(async () => (await direct[i].exists(`lock:{${key}}`)) === 1, 1_000),
            `the first grant never reached node ${i}`,
          );
        }
        for (const i of [2, 3, 4]) await direct[i].del(`lock:{${key}}`);
        for (const proxy of proxies) proxy.heal();
        const lock = await pending;
        if (acquireTimeout === 0) {
          // No node refused: not busy, and no time to wait for (none was named).
          assert.ok(lock instanceof LockAcquireTimeoutError, String(lock));
          assert.deepEqual([lock.busy, lock.retryAfterMs], [false, undefined]);
          continue;
        }
        assert.ok(!(lock instanceof Error), String(lock));
        const { token } = lock as Lock;
        assert.ok(
          (await holders(key, token)) >= 3,
          `a lock held on ${await holders(key, token)} node(s) of five`,
        );
        await (lock as Lock).release();
      }
    } finally {
      for (const proxy of proxies) proxy.heal();
      await slow.close();
      await Promise.all(proxies.map((proxy) => proxy.close()));
    }
  });

  it('generated tokens write no fence record on any node', async () => {
    const key = uniqueKey();
    const lock = await locks.acquire(key, { ttl: 10_000 });
    assert.ok(await eventually(async () => (await holders(key, lock.token)) === NODES));
    for (const client of direct) assert.equal(await client.exists(`lock:{${key}}:fence`), 0);
    await lock.release();
  });

  it('a caller queued behind a waiter of its own process and aborted before its first attempt gets the abort, and the lock goes on to the waiter (found by mutation testing)', async () => {
    const key = 'redlock-queued-abort';
    const holder = await locks.acquire(key, { ttl: 10_000 });
    const waiter = locks.acquire(key, { acquireTimeout: 10_000 });
    const backend = (
      locks as unknown as { engine: { backend: { hasWaiters(k: string): boolean } } }
    ).engine.backend;
    // The waiter's attempt was refused and its subscription is confirmed: the next caller queues
    // behind it without asking the nodes.
    for (const started = Date.now(); !backend.hasWaiters(key);) {
      assert.ok(Date.now() - started < 5_000, 'the waiter never started to watch for releases');
      await new Promise((resolve) => setTimeout(resolve, 5));
    }
    const controller = new AbortController();
    const queued = locks.acquire(key, { acquireTimeout: 10_000, signal: controller.signal });
    controller.abort(new Error('client went away'));
    await assert.rejects(queued, LockAcquireAbortedError);
    await holder.release();
    const next = await waiter;
    await next.release();
  });

  it('control: 3 processes incrementing without the lock lose updates; under it the count is exact', async () => {
    const target = `redlock:${servers.map((server) => server.port).join(',')}`;
    const read = (counter: string): Promise<string | null> => direct[0].get(counter);
    // Without the lock the processes overlap once all three are up (they boot at different times).
    // One start of the processes: first the control without the lock, then under it.
    const { raced, locked } = await raceThenLock(target, 3, 300, 25, read);
    assert.ok(raced < 900, `the control lost no update: ${raced}`);
    assert.equal(locked, 75, `lost updates under the lock: ${locked} of 75`);
  });

  it('several keys: 4 processes, two naming them in the opposite order, end with exact counts and no deadlock', async () => {
    const target = `redlock:${servers.map((server) => server.port).join(',')}`;
    const read = (counter: string): Promise<string | null> => direct[0].get(counter);
    // One start of the processes: first the control without the lock, then under it.
    const { raced, locked } = await transfersRaceThenLock(target, 4, 200, 20, read);
    assert.ok(
      raced.some((n) => n < 800),
      `the control lost no update: ${raced.join(', ')}`,
    );
    assert.deepEqual(
      locked,
      [80, 80],
      `lost updates under the lock: ${String(locked)} of [80, 80]`,
    );
  });

  it('rejects a counting semaphore (limit > 1), a read lock and a fair lock with a LockArgumentError naming the option and nodes, taking nothing', async () => {
    const key = uniqueKey();
    const error = await app.locks.acquire(key, { limit: 2 }).catch((e: unknown) => e);
    assert.ok(
      error instanceof LockArgumentError && error.argument === 'limit + nodes',
      String(error),
    );
    const read = await app.locks.acquire(key, { mode: 'read' }).catch((e: unknown) => e);
    assert.ok(read instanceof LockArgumentError && read.argument === 'mode + nodes', String(read));
    const fair = await app.locks.acquire(key, { fair: true }).catch((e: unknown) => e);
    assert.ok(fair instanceof LockArgumentError && fair.argument === 'fair + nodes', String(fair));
    assert.equal(await app.locks.isLocked(key), false);
  });

  it('closes the clients it created on shutdown, never the ones it was given', async () => {
    const given = servers
      .slice(0, 2)
      .map((server) => new Redis(server.port, server.host).on('error', () => {}));
    const countClients = async (): Promise<number> =>
      String(await direct[2].call('CLIENT', 'LIST'))
        .trim()
        .split('\n').length;
    const baseline = await countClients();
    const fixture = await startLockModule({
      nodes: [...given, servers[2].url, { host: servers[3].host, port: servers[3].port }],
    });
    try {
      const key = uniqueKey();
      const lock = await fixture.locks.acquire(key);
      assert.ok(
        await eventually(async () => (await holders(key, lock.token, [0, 1, 2, 3].values())) === 4),
      );
      await lock.release();
      assert.ok((await countClients()) > baseline);
      await fixture.close();
      assert.ok(await eventually(async () => (await countClients()) === baseline));
      for (const client of given) assert.equal(await client.ping(), 'PONG');
    } finally {
      await fixture.close();
      for (const client of given) client.disconnect();
    }
  });

  it('rejects Redlock options that cannot work, naming them', async () => {
    const urls = servers.map((server) => server.url);
    const cases: [object, RegExp][] = [
      [{ nodes: urls.slice(0, 2) }, /"nodes".*at least 3/],
      [{ nodes: [] }, /"nodes"/],
      [{ nodes: 'redis://x:1' }, /"nodes"/],
      [{ nodes: urls, connection: urls[0] }, /"connection \+ nodes"/],
      [{ nodes: [urls[0], urls[1], urls[0]] }, /"nodes\[0\] \+ nodes\[2\]".*same server/],
      [{ nodes: [urls[0], urls[1], 'http://x'] }, /"nodes\[2\]".*redis:\/\//],
      [{ nodes: [urls[0], urls[1], 42] }, /"nodes\[2\]"/],
      [{ nodes: urls, driftFactor: 0.7 }, /"driftFactor"/],
      [{ connection: urls[0], driftFactor: 0.01 }, /"driftFactor \+ connection"/],
    ];
    for (const [options, message] of cases) {
      await assert.rejects(startLockModule(options), (error: unknown) => {
        assert.ok(error instanceof RedisLockConfigurationError, String(error));
        assert.match(error.message, message);
        return true;
      });
    }
  });
});
