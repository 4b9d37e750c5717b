/**
 * Every public operation settles in bounded time whatever Redis does: killed (connections
 * refused), paused with SIGSTOP (connections open, no replies), restarted empty. Run for a
 * connection the module creates and for a client the app passes with ioredis' defaults (offline
 * queue on, 20 retries per request), which the module must not reconfigure.
 */
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import {
  Controller,
  Module,
  Param,
  Post,
  type DynamicModule,
  type INestApplication,
} from '@nestjs/common';
import { Test } from '@nestjs/testing';
import { Cluster, Redis } from 'ioredis';
import {
  LockBackendError,
  LockLostError,
  LockQuorumError,
  LockService,
  RedisLockModule,
  WithLock,
  type Lock,
  type RedisLockModuleOptions,
} from '../../lib/index.js';
import {
  eventually,
  LogCapture,
  setUpStep,
  sleep,
  startLockModule,
  uniqueKey,
  type LockModuleFixture,
} from '../support/lock-module.js';
import {
  startCluster,
  startRedis,
  startSentinel,
  type RedisServer,
} from '../support/redis-server.js';
import { assertWithin, watchStalls } from '../support/timing.js';

const COMMAND_TIMEOUT = 300;
/**
 * How much sooner than `commandTimeout` a deadline may end on the clock the test reads, and still be
 * the deadline: Node sets a timer from the event loop's cached time, taken when the current turn of
 * the loop began, so a timer set late in a long turn (a loaded machine, a GC) fires that much early
 * by the wall clock; and `settle()` reads its start after the call's synchronous part (failed in CI:
 * 294 ms for 300). A tenth of the deadline: a deadline cut by any real mistake (halved, a timer
 * started at the wrong time) is still well under it.
 */
const EARLY = COMMAND_TIMEOUT / 10;

/** Work that a test finishes by hand, keyed by name. */
const gates = new Map<string, () => void>();
const gate = (name: string): Promise<void> =>
  new Promise((resolve) => gates.set(name, () => resolve()));
const open = (name: string): void => gates.get(name)?.();

@Controller('jobs')
class JobsController {
  @Post(':id')
  @WithLock({ key: 'job:{0}', ttl: 5_000 })
  async run(@Param('id') id: string): Promise<{ id: string; done: boolean }> {
    await gate(`route:${id}`);
    return { id, done: true };
  }
}

@Module({ controllers: [JobsController] })
class JobsModule {}

interface Outcome<T> {
  value?: T;
  error?: unknown;
  /** ms from `from` to settling. */
  elapsed: number;
  /** When it settled, on the performance.now() clock. */
  at: number;
  /**
   * What the machine added meanwhile (ms, see `watchStalls`): on a loaded machine the process may
   * not run at all for a while, and no timer, the library's or anyone's, fires before it runs again.
   */
  slack: number;
}

/** Records how `promise` settles and when, counted from `from` (default: now). */
async function settle<T>(promise: Promise<T>, from = performance.now()): Promise<Outcome<T>> {
  const watch = watchStalls();
  const outcome = (result: { value?: T; error?: unknown }): Outcome<T> => {
    const at = performance.now();
    const slack = watch.slack();
    watch.stop();
    return { ...result, elapsed: at - from, at, slack };
  };
  try {
    return outcome({ value: await promise });
  } catch (error) {
    return outcome({ error });
  }
}

/** Asserts that `outcome` came within `bound` ms and what the machine added, and no sooner than `atLeast`. */
function assertTook(
  outcome: Outcome<unknown>,
  bound: number,
  what: string,
  atLeast?: number,
): void {
  assertWithin(outcome.elapsed, bound, { slack: () => outcome.slack }, what, atLeast);
}

/**
 * Asserts a LockBackendError of `operation` within commandTimeout (and what the machine added);
 * with `waited`, no sooner than commandTimeout: a reply deadline is not cut short.
 */
function assertBackendError(outcome: Outcome<unknown>, operation: string, waited = false): void {
  assert.ok(
    outcome.error instanceof LockBackendError,
    `expected LockBackendError: ${String(outcome.error ?? outcome.value)}`,
  );
  assert.equal(outcome.error.operation, operation);
  assertTook(outcome, COMMAND_TIMEOUT, operation, waited ? COMMAND_TIMEOUT - EARLY : undefined);
}

const sources = {
  'a connection the module creates': (server: RedisServer): RedisLockModuleOptions => ({
    connection: server.url,
  }),
  "the app's own client (ioredis defaults)": (server: RedisServer): RedisLockModuleOptions => {
    const client = new Redis(server.port, server.host);
    client.on('error', () => {}); // an app listens for these; the default handler only logs them
    return { client };
  },
} as const;

const faults = {
  killed: (server: RedisServer) => server.kill(),
  'paused (SIGSTOP)': (server: RedisServer) => Promise.resolve(server.signal('SIGSTOP')),
} as const;

for (const [faultName, applyFault] of Object.entries(faults)) {
  for (const [sourceName, optionsFor] of Object.entries(sources)) {
    describe(`bounded operations: Redis ${faultName}, ${sourceName}`, () => {
      let server: RedisServer;
      let app: INestApplication;
      let url: string;
      let locks: LockService;
      let ownClient: Redis | undefined;
      let toRelease: Lock;
      let toExtend: Lock;
      let usingResult: Promise<Outcome<string>>;
      let usingError: Promise<Outcome<string>>;
      let route: Promise<Outcome<Response>>;
      let gatesOpenedAt: number;
      let logs: ReturnType<typeof LogCapture.install>;
      /**
       * Whether a call waits out commandTimeout before it fails: Redis paused, or killed behind an
       * app's client that queues while it reconnects (silence); a refused connection fails at once.
       */
      const waits = faultName !== 'killed' || !sourceName.startsWith('a connection');

      // Each step of the set-up is bounded and named: one that hangs (a loaded machine, a server
      // slow to start) fails this hook saying which, instead of the file's timeout cancelling the
      // tests below it.
      before(
        async () => {
          server = await setUpStep('starting redis-server', startRedis());
          const options = optionsFor(server);
          ownClient = options.client as Redis | undefined;
          const lockModule: DynamicModule = RedisLockModule.forRoot({
            ...options,
            commandTimeout: COMMAND_TIMEOUT,
            isGlobal: true,
          });
          const module = await setUpStep(
            'compiling the testing module',
            Test.createTestingModule({ imports: [lockModule, JobsModule] }).compile(),
          );
          app = module.createNestApplication({ logger: false });
          await setUpStep('starting the HTTP app', app.listen(0, '127.0.0.1'));
          url = (await app.getUrl()).replace('[::1]', '127.0.0.1');
          locks = app.get(LockService);
          logs = LogCapture.install();

          // Locks held and work in flight when Redis fails.
          toRelease = await setUpStep(
            'acquiring the lock to release',
            locks.acquire(uniqueKey('release')),
          );
          toExtend = await setUpStep(
            'acquiring the lock to extend',
            locks.acquire(uniqueKey('extend')),
          );
          usingResult = settle(
            locks.using(uniqueKey('using'), async () => {
              await gate('using-result');
              return 'the work result';
            }),
          );
          usingError = settle(
            locks.using(uniqueKey('using'), async () => {
              await gate('using-error');
              throw new Error('the work failed');
            }),
          );
          const routeId = uniqueKey('route');
          route = settle(fetch(`${url}/jobs/${routeId}`, { method: 'POST' }));
          assert.ok(
            await eventually(() => gates.has(`route:${routeId}`), 30_000),
            'the route holds its lock (within 30 s)',
          );
          assert.ok(
            await eventually(() => gates.has('using-result') && gates.has('using-error'), 30_000),
            'both using() calls run their work (within 30 s)',
          );

          await setUpStep(`the fault (${faultName})`, applyFault(server));
          await sleep(50);
          gatesOpenedAt = performance.now();
          for (const name of gates.keys()) open(name);
          gates.clear();
        },
        { timeout: 300_000 },
      );

      after(async () => {
        logs?.restore();
        server?.signal('SIGCONT');
        await app?.close();
        ownClient?.disconnect();
        await server?.stop();
      });

      it('tryAcquire() fails with LockBackendError within commandTimeout', async () => {
        assertBackendError(await settle(locks.tryAcquire(uniqueKey())), 'acquire', waits);
      });

      it('acquire() with acquireTimeout 0 fails with LockBackendError within commandTimeout', async () => {
        assertBackendError(
          await settle(locks.acquire(uniqueKey(), { acquireTimeout: 0 })),
          'acquire',
          waits,
        );
      });

      it('acquire() with a long acquireTimeout fails within commandTimeout, not after the deadline', async () => {
        const outcome = await settle(locks.acquire(uniqueKey(), { acquireTimeout: 10_000 }));
        assertBackendError(outcome, 'acquire', waits);
      });

      it('a @WithLock route whose lock cannot reach Redis answers 503 (unavailable, not busy) within commandTimeout', async () => {
        const id = uniqueKey('down');
        const outcome = await settle(fetch(`${url}/jobs/${id}`, { method: 'POST' }));
        assert.equal(outcome.value?.status, 503);
        const body = (await outcome.value.json()) as { message: string };
        assert.match(
          body.message,
          /^The lock service is unavailable: Redis (failed|did not answer in time) during acquire \(.+\)\. Retry later\.$/,
        );
        // The key came from the request: the answer does not echo it.
        assert.ok(!body.message.includes(id), body.message);
        assertTook(outcome, COMMAND_TIMEOUT, 'the answer');
      });

      it('the error says which Redis and why, in one sentence: refused or no reply, never an ioredis option the module set', async () => {
        const { error } = await settle(locks.tryAcquire(uniqueKey()));
        assert.ok(error instanceof LockBackendError, String(error));
        assert.doesNotMatch(error.message, /maxRetriesPerRequest|max retries|\.\./);
        assert.match(
          error.message,
          faultName === 'killed'
            ? sourceName.startsWith('a connection')
              ? new RegExp(
                  `Redis at ${server.host}:${server.port} is unreachable \\(.*ECONNREFUSED`,
                )
              : // ioredis' defaults queue the command while it reconnects: silence, then
                /no reply within commandTimeout \(300 ms\)/
            : /no reply within commandTimeout \(300 ms\)/,
        );
      });

      it('isLocked() fails with LockBackendError within commandTimeout', async () => {
        assertBackendError(await settle(locks.isLocked(uniqueKey())), 'isLocked', waits);
      });

      it('lock.release() fails with LockBackendError within commandTimeout', async () => {
        assertBackendError(await settle(toRelease.release()), 'release', waits);
      });

      it('lock.extend() fails with LockBackendError within commandTimeout', async () => {
        assertBackendError(await settle(toExtend.extend()), 'extend', waits);
        await settle(toExtend.release());
      });

      it("using() returns the work's result when its release gets no answer, and logs the release failure", async () => {
        const outcome = await usingResult;
        assert.equal(outcome.value, 'the work result');
        const sinceWorkEnded = { ...outcome, elapsed: outcome.at - gatesOpenedAt };
        assertTook(sinceWorkEnded, COMMAND_TIMEOUT, 'the return after the work');
        assert.ok(
          logs.capture.lines.some((l) => l.level === 'error' && l.message.includes('release')),
          JSON.stringify(logs.capture.lines),
        );
      });

      it("using() rethrows the work's own error when its release gets no answer", async () => {
        const outcome = await usingError;
        assert.ok(outcome.error instanceof Error && !(outcome.error instanceof LockBackendError));
        assert.equal(outcome.error.message, 'the work failed');
        assertTook(
          { ...outcome, elapsed: outcome.at - gatesOpenedAt },
          COMMAND_TIMEOUT,
          'the rethrow after the work',
        );
      });

      it("a @WithLock route answers with the handler's result when its release gets no answer", async () => {
        const outcome = await route;
        assert.equal(outcome.value?.status, 201);
        assert.equal(((await outcome.value.json()) as { done: boolean }).done, true);
        assertTook(
          { ...outcome, elapsed: outcome.at - gatesOpenedAt },
          COMMAND_TIMEOUT,
          'the answer after the work',
        );
      });

      it('shutdown finishes in bounded time and leaves no handle behind', async () => {
        const held = await settle(locks.tryAcquire(uniqueKey()));
        assert.ok(held.error instanceof LockBackendError);
        const outcome = await settle(app.close());
        assert.equal(outcome.error, undefined);
        // Releases of held locks, then QUIT of each connection: each waits commandTimeout at most.
        assertTook(outcome, 2 * COMMAND_TIMEOUT, 'shutdown');
      });
    });
  }
}

describe('bounded operations: Redis restarted empty', () => {
  let server: RedisServer;
  let fixture: LockModuleFixture;
  let locks: LockService;
  let redis: Redis;

  before(async () => {
    server = await setUpStep('starting redis-server', startRedis());
    fixture = await setUpStep(
      'starting the lock module',
      startLockModule({ connection: server.url, commandTimeout: COMMAND_TIMEOUT }),
    );
    locks = fixture.locks;
  });
  after(async () => {
    await fixture?.close();
    redis?.disconnect();
    await server?.stop();
  });

  it('a lock held across the restart is known lost; locking resumes by itself; fences keep growing', async () => {
    const key = uniqueKey();
    const watched = await locks.acquire(key, { ttl: 900, autoExtend: true });
    const plain = await locks.acquire(uniqueKey(), { ttl: 30_000 });
    await server.kill();
    // While it is down, every call fails fast and typed.
    assertBackendError(await settle(locks.tryAcquire(uniqueKey())), 'acquire');
    server = await server.restart();
    redis = new Redis(server.port, server.host);

    // The new server knows no lock: the watchdog's next extension finds the lock gone.
    assert.ok(await eventually(() => watched.signal.aborted, 5_000), 'signal aborted');
    const reason = (watched.signal.reason as LockLostError).reason;
    assert.ok(reason === 'not-held' || reason === 'unconfirmed', reason);

    // Locking resumes without restarting the app: ioredis reconnects on its own.
    let next: Lock | null = null;
    const resumed = await eventually(async () => {
      next = await locks.tryAcquire(key).catch(() => null);
      return next !== null;
    }, 5_000);
    assert.ok(resumed, 'locking resumed after the restart');
    // The fence counter died with the old server; the clock part keeps the next fence ahead.
    assert.ok(next!.fence > watched.fence, `${next!.fence} > ${watched.fence}`);
    assert.equal(await plain.release(), false, 'the old lock is not ours any more');
    await assert.rejects(plain.extend(), LockLostError);
    await next!.release();
    await watched.release();
    assert.deepEqual(await redis.keys('lock:{*}'), []);
  });

  it('after a reconnection every held lock is checked at once: one the restart lost aborts long before its TTL', async () => {
    const lock = await locks.acquire(uniqueKey(), { ttl: 30_000 }); // no auto-extension
    await server.kill();
    server = await server.restart();
    redis.disconnect();
    redis = new Redis(server.port, server.host);
    assert.ok(await eventually(() => lock.signal.aborted, 5_000), 'the lost lock aborted');
    assert.equal((lock.signal.reason as LockLostError).reason, 'not-held');
    await lock.release();
  });

  it('a reconnection that lost nothing (connections reset, Redis kept its state) aborts nothing', async () => {
    const lock = await locks.acquire(uniqueKey(), { ttl: 30_000 });
    const before = Number(/total_connections_received:(\d+)/.exec(await redis.info('stats'))![1]);
    await redis.call('CLIENT', 'KILL', 'TYPE', 'normal', 'SKIPME', 'yes');
    // The module's connection comes back (and checks the lock) ...
    assert.ok(
      await eventually(async () => {
        const stats = await redis.info('stats');
        return Number(/total_connections_received:(\d+)/.exec(stats)![1]) > before;
      }, 5_000),
    );
    assert.equal(await locks.isLocked(lock.key), true);
    await sleep(100);
    // ... and finds it still ours.
    assert.equal(lock.signal.aborted, false);
    assert.equal(await lock.release(), true);
  });

  it("with the app's own client (ioredis defaults), an acquisition queued while Redis was down and sent once it is back is released when its reply arrives", async () => {
    const own = new Redis(server.port, server.host);
    own.on('error', () => {}); // an app listens for these; the default handler only logs them
    const app = await startLockModule({ client: own, commandTimeout: COMMAND_TIMEOUT });
    try {
      await (await app.locks.acquire(uniqueKey())).release(); // connected, scripts loaded
      const key = uniqueKey();
      await server.kill();
      // ioredis queues the attempt while it reconnects: no reply within commandTimeout.
      assertBackendError(await settle(app.locks.tryAcquire(key, { ttl: 30_000 })), 'acquire', true);
      server = await server.restart();
      redis.disconnect();
      redis = new Redis(server.port, server.host);
      // Sent once ioredis is back: the empty server grants it (the fence counter it creates
      // says so), and nobody waits for it any more: released at once, not left for its 30 s.
      assert.ok(
        await eventually(async () => (await redis.exists('lock:{}:counter')) === 1, 5_000),
        'the queued attempt never reached the server',
      );
      assert.ok(
        await eventually(async () => (await redis.exists(`lock:{${key}}`)) === 0, 2_000),
        'the late grant was left in Redis',
      );
      // The suite's own module reconnects too before the next test uses it (its commands fail
      // at once meanwhile: maxRetriesPerRequest 0).
      assert.ok(
        await eventually(
          () =>
            locks.isLocked(uniqueKey()).then(
              () => true,
              () => false,
            ),
          5_000,
        ),
        "the suite's module did not reconnect",
      );
    } finally {
      await app.close();
      own.disconnect();
    }
  });

  it('a waiter that waits through the restart settles within acquireTimeout + commandTimeout', async () => {
    const key = uniqueKey();
    const held = await locks.acquire(key, { ttl: 30_000 });
    const started = performance.now();
    const waiting = settle(locks.acquire(key, { acquireTimeout: 1_500 }), started);
    await sleep(200);
    await server.kill();
    server = await server.restart();
    redis.disconnect();
    redis = new Redis(server.port, server.host);
    const outcome = await waiting;
    // Either an attempt met the dead server (LockBackendError) or, after the restart, the empty
    // server granted the lock: both are correct; hanging is not.
    assert.ok(
      outcome.error instanceof LockBackendError || outcome.value !== undefined,
      String(outcome.error),
    );
    assertTook(outcome, 1_500 + COMMAND_TIMEOUT, 'the wait across the restart');
    await outcome.value?.release();
    await held.release().catch(() => false);
  });
});

/**
 * The bound lives in LockService, above the topology: the same calls on a Cluster (every node
 * frozen), through Sentinel (the master frozen) and in Redlock mode (a majority of three nodes
 * frozen: the cause says what each did) settle within commandTimeout too.
 */
const topologies = {
  'Redis Cluster, every node paused': async () => {
    const cluster = await startCluster(3);
    const client = new Cluster(cluster.nodes.map((n) => ({ host: n.host, port: n.port })));
    client.on('error', () => {});
    return {
      options: { client },
      freeze: () => cluster.nodes.forEach((n) => n.signal('SIGSTOP')),
      stop: async () => {
        cluster.nodes.forEach((n) => n.signal('SIGCONT'));
        client.disconnect();
        await cluster.stop();
      },
    };
  },
  'Redlock (3 nodes), a majority paused': async () => {
    const nodes = await Promise.all([0, 1, 2].map(() => startRedis()));
    return {
      options: { nodes: nodes.map((node) => node.url) },
      quorum: true,
      freeze: () => nodes.slice(0, 2).forEach((node) => node.signal('SIGSTOP')),
      stop: async () => {
        nodes.forEach((node) => node.signal('SIGCONT'));
        await Promise.all(nodes.map((node) => node.stop()));
      },
    };
  },
  'Sentinel, master paused': async () => {
    const master = await startRedis();
    const sentinel = await startSentinel(master);
    return {
      options: {
        connection: { sentinels: [{ host: sentinel.host, port: sentinel.port }], name: 'mymaster' },
      },
      freeze: () => master.signal('SIGSTOP'),
      stop: async () => {
        master.signal('SIGCONT');
        await sentinel.stop();
        await master.stop();
      },
    };
  },
} satisfies Record<
  string,
  () => Promise<{
    options: RedisLockModuleOptions;
    /** Redlock: the error's cause is a `LockQuorumError`. */
    quorum?: boolean;
    freeze(): void;
    stop(): Promise<void>;
  }>
>;

for (const [name, start] of Object.entries(topologies)) {
  describe(`bounded operations: ${name}`, () => {
    it('tryAcquire, acquire, isLocked, release, extend and shutdown all settle within commandTimeout', async () => {
      const topology: { quorum?: boolean } & Awaited<ReturnType<typeof start>> = await start();
      const app = await startLockModule({ ...topology.options, commandTimeout: COMMAND_TIMEOUT });
      let closed = false;
      try {
        const held = await app.locks.acquire(uniqueKey());
        const extended = await app.locks.acquire(uniqueKey());
        topology.freeze();
        const outcomes = await Promise.all([
          settle(app.locks.tryAcquire(uniqueKey())),
          settle(app.locks.acquire(uniqueKey(), { acquireTimeout: 10_000 })),
          settle(app.locks.isLocked(uniqueKey())),
          settle(held.release()),
          settle(extended.extend()),
        ]);
        const operations = ['acquire', 'acquire', 'isLocked', 'release', 'extend'];
        // Frozen: no reply, so each waits out its reply deadline, and no longer.
        outcomes.forEach((outcome, i) => assertBackendError(outcome, operations[i], true));
        if (topology.quorum) {
          // Redlock: what each node did is in the cause.
          for (const outcome of outcomes) {
            const { cause } = outcome.error as LockBackendError;
            assert.ok(cause instanceof LockQuorumError, String(cause));
            assert.deepEqual([cause.nodes, cause.quorum, cause.answered], [3, 2, 1]);
          }
        }
        const closing = await settle(app.close());
        closed = true;
        assert.equal(closing.error, undefined);
        assertTook(closing, 2 * COMMAND_TIMEOUT, 'shutdown');
      } finally {
        if (!closed) await app.close();
        await topology.stop();
      }
    });
  });
}
