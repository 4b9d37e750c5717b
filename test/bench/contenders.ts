/**
 * The locks the benchmark compares, behind one shape: take the lock on a key (waiting for it),
 * give it back. Each gets the same ioredis client settings; where a library's retry is
 * configurable it runs twice, with its defaults and with a ~10 ms retry. Each loads its library
 * when created, so that a run's fresh process loads only its own (ours alone takes ~0.4 s).
 */
import { randomUUID } from 'node:crypto';
import type { Cluster, Redis } from 'ioredis';
import type { Lock as UniversalLock } from 'redlock-universal';
import type { LockService } from '../../lib/index.js';
import type { Topology, Workload } from './bench-protocol.js';

/** A held lock: give it back with release(). */
export interface Held {
  release(): Promise<unknown>;
}

export interface Locker {
  /** Takes the lock on `key`, waiting for it up to `waitMs`; rejects if it cannot. */
  acquire(key: string, ttl: number, waitMs: number): Promise<Held>;
  close(): Promise<void>;
}

/** The lock's connections in a worker (each counted, see bench-worker.ts). */
export interface Connections {
  /** One Redis; on the Cluster section, a Cluster client. */
  client: Redis | Cluster;
  /** The Redlock section's independent masters (elsewhere the one client). */
  nodes: Redis[];
}

export interface Contender {
  name: string;
  /** A library's second configuration, with a ~10 ms retry: differs from the defaults only when waiting. */
  retryVariant?: boolean;
  /** Run only in these workloads (a variant that differs only there). */
  workloads?: readonly Workload[];
  /** Where it runs (default: one server only). */
  topologies?: readonly Topology[];
  create(connections: Connections): Promise<Locker>;
}

/**
 * Our `LockService` on the client (in the Redlock section, on the nodes), its log silenced as the
 * other libraries' are.
 */
async function lockService(
  { client, nodes }: Connections,
  build = '../../lib/index.js',
  keyPrefix = 'nrl:',
): Promise<LockService> {
  const [{ Logger }, { LockService }] = await Promise.all([
    import('@nestjs/common'),
    import(build) as Promise<typeof import('../../lib/index.js')>,
  ]);
  Logger.overrideLogger(false);
  return new LockService(nodes.length > 1 ? { nodes, keyPrefix } : { client, keyPrefix });
}

/** The hand-written minimum: SET NX PX, a 10 ms poll, compare-and-delete by EVALSHA. */
const minimum: Contender = {
  name: 'hand-written minimum',
  topologies: ['single', 'cluster'],
  async create({ client }) {
    client.defineCommand('benchRelease', {
      numberOfKeys: 1,
      lua: "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0",
    });
    const release = client as unknown as {
      benchRelease(key: string, token: string): Promise<number>;
    };
    return {
      async acquire(key, ttl, waitMs) {
        const token = randomUUID();
        const end = performance.now() + waitMs;
        for (;;) {
          if ((await client.set(`min:${key}`, token, 'PX', ttl, 'NX')) === 'OK') {
            return { release: () => release.benchRelease(`min:${key}`, token) };
          }
          if (performance.now() >= end) throw new Error('timeout');
          await new Promise((resolve) => setTimeout(resolve, 10));
        }
      },
      close: async () => {},
    };
  },
};

const ours: Contender = {
  name: 'nestjs-redis-lock',
  topologies: ['single', 'redlock', 'cluster'],
  async create(connections) {
    const locks = await lockService(connections);
    return {
      acquire: (key, ttl, waitMs) => locks.acquire(key, { ttl, acquireTimeout: waitMs }),
      close: () => locks.onApplicationShutdown(),
    };
  },
};

/** Ours with a subscriber on `LockService.events`: what the events cost when someone listens. */
const oursObserved: Contender = {
  name: 'nestjs-redis-lock (events subscribed)',
  workloads: ['sequential', 'concurrent'],
  async create(connections) {
    const locks = await lockService(connections);
    let events = 0;
    const subscription = locks.events.subscribe(() => void events++);
    return {
      acquire: (key, ttl, waitMs) => locks.acquire(key, { ttl, acquireTimeout: waitMs }),
      close: async () => {
        await locks.onApplicationShutdown();
        subscription.unsubscribe();
      },
    };
  },
};

/** Ours with `fair: true`: waiters get the hot key in arrival order across processes. */
const oursFair: Contender = {
  name: 'nestjs-redis-lock (fair)',
  workloads: ['hot'],
  async create(connections) {
    const locks = await lockService(connections);
    return {
      acquire: (key, ttl, waitMs) =>
        locks.acquire(key, { ttl, acquireTimeout: waitMs, fair: true }),
      close: () => locks.onApplicationShutdown(),
    };
  },
};

const redisSemaphore: Contender = {
  name: 'redis-semaphore',
  topologies: ['single', 'cluster'],
  async create({ client }) {
    const { Mutex } = await import('redis-semaphore');
    return {
      async acquire(key, ttl, waitMs) {
        // Its default retryInterval is already 10 ms; its default refresh (a timer per lock) stays on.
        const mutex = new Mutex(client, key, { lockTimeout: ttl, acquireTimeout: waitMs });
        await mutex.acquire();
        return { release: () => mutex.release() };
      },
      close: async () => {},
    };
  },
};

function sesame(retry: 'defaults' | '10 ms'): Contender {
  return {
    name: `@sesamecare-oss/redlock (${retry})`,
    retryVariant: retry === '10 ms',
    topologies: ['single', 'redlock'],
    async create({ nodes }) {
      const { Redlock: SesameRedlock } = await import('@sesamecare-oss/redlock');
      const base = retry === 'defaults' ? {} : { retryDelay: 10, retryJitter: 5 };
      const redlock = new SesameRedlock(nodes, base);
      return {
        async acquire(key, ttl, waitMs) {
          const delay = retry === 'defaults' ? 200 : 10;
          const retryCount = retry === 'defaults' ? undefined : Math.ceil(waitMs / delay);
          const lock = await redlock.acquire(
            [`sesame:${key}`],
            ttl,
            retryCount === undefined ? {} : { retryCount },
          );
          return { release: () => lock.release() };
        },
        close: async () => {},
      };
    },
  };
}

function redlock4(retry: 'defaults' | '10 ms'): Contender {
  return {
    name: `redlock 4 (${retry})`,
    retryVariant: retry === '10 ms',
    topologies: ['single', 'redlock'],
    async create({ nodes }) {
      const { default: Redlock4 } = await import('redlock');
      const options =
        retry === 'defaults' ? {} : { retryDelay: 10, retryJitter: 5, retryCount: -1 };
      const redlock = new Redlock4(nodes as never[], options);
      redlock.on('clientError', () => {});
      return {
        async acquire(key, ttl) {
          const lock = await redlock.lock(`redlock4:${key}`, ttl);
          return { release: async () => lock.unlock() };
        },
        close: async () => {},
      };
    },
  };
}

function universal(retry: 'defaults' | '10 ms'): Contender {
  return {
    name: `redlock-universal (${retry})`,
    retryVariant: retry === '10 ms',
    topologies: ['single', 'redlock'],
    async create({ nodes }) {
      const { createLock, createRedlock, IoredisAdapter } = await import('redlock-universal');
      const adapters = nodes.map((node) => IoredisAdapter.from(node));
      return {
        async acquire(key, ttl, waitMs) {
          // A lock object is bound to its key: one per acquisition (a cache would grow per key).
          // On several nodes its Redlock, on one its single-server lock.
          const retries =
            retry === 'defaults' ? {} : { retryDelay: 10, retryAttempts: Math.ceil(waitMs / 10) };
          const lock: UniversalLock =
            adapters.length > 1
              ? createRedlock({ adapters, key: `universal:${key}`, ttl, ...retries })
              : createLock({ adapter: adapters[0], key: `universal:${key}`, ttl, ...retries });
          const handle = await lock.acquire();
          return { release: () => lock.release(handle) };
        },
        close: async () => {},
      };
    },
  };
}

/**
 * With `BENCH_BASELINE=<path to another build's lib/index.js>`: that build of this library beside
 * this one, in the same run (for a change that must not cost speed: a refactor, a dependency), on
 * every topology. Its `node_modules` must be a link to this checkout's: the Redlock and Cluster
 * sections hand it this run's ioredis clients, which another copy of ioredis does not take for
 * clients (its runs never finished).
 */
const baseline: Contender | undefined =
  process.env.BENCH_BASELINE === undefined
    ? undefined
    : {
        name: 'nestjs-redis-lock (baseline build)',
        topologies: ['single', 'redlock', 'cluster'],
        async create(connections) {
          const locks = await lockService(connections, process.env.BENCH_BASELINE, 'nrl-base:');
          return {
            acquire: (key, ttl, waitMs) => locks.acquire(key, { ttl, acquireTimeout: waitMs }),
            close: () => locks.onApplicationShutdown(),
          };
        },
      };

/**
 * With `BENCH_TURNS=0,25,100`: ours with each of those `handoffTurn`s beside the default, in the
 * workloads where anyone waits (3, 7), to choose the default by the callers' wait.
 */
const turns: Contender[] = (process.env.BENCH_TURNS ?? '')
  .split(',')
  .filter((turn) => turn.trim() !== '')
  .map((turn) => ({
    name: `nestjs-redis-lock (handoffTurn ${Number(turn)})`,
    workloads: ['hot'],
    async create({ client }) {
      const [{ Logger }, { LockService }] = await Promise.all([
        import('@nestjs/common'),
        import('../../lib/index.js'),
      ]);
      Logger.overrideLogger(false);
      const locks = new LockService({ client, keyPrefix: 'nrl:', handoffTurn: Number(turn) });
      return {
        acquire: (key, ttl, waitMs) => locks.acquire(key, { ttl, acquireTimeout: waitMs }),
        close: () => locks.onApplicationShutdown(),
      };
    },
  }));

export const CONTENDERS: Contender[] = [
  minimum,
  ours,
  ...(baseline ? [baseline] : []),
  ...turns,
  oursObserved,
  oursFair,
  redisSemaphore,
  sesame('defaults'),
  sesame('10 ms'),
  redlock4('defaults'),
  redlock4('10 ms'),
  universal('defaults'),
  universal('10 ms'),
];
