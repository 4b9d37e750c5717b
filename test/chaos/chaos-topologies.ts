/**
 * The lock deployments the chaos suite runs on. Each starts its own servers, gives every worker
 * its own fault proxies (one in front of each lock server), and says what the Redis faults of a
 * scenario do to it: on one Redis they hit that Redis; in Redlock mode one node of three (a
 * minority); on Cluster and Sentinel a master, so that a crash becomes a failover.
 */
import { Redis } from 'ioredis';
import { FaultProxy } from '../support/fault-proxy.js';
import {
  keySlot,
  startCluster,
  startRedis,
  startSentinelGroup,
  until,
  type RedisServer,
} from '../support/redis-server.js';
import { skewedClock, type ClockSkew } from '../support/skewed-clock.js';
import type { Address, WorkerLock } from './chaos-protocol.js';

export type ChaosMode = 'standalone' | 'redlock' | 'redlock-clocks' | 'cluster' | 'sentinel';
export const CHAOS_MODES: readonly ChaosMode[] = [
  'standalone',
  'redlock',
  'redlock-clocks',
  'cluster',
  'sentinel',
];

/**
 * The clocks of Redlock's nodes in the `redlock-clocks` mode: one 400 ms behind and running 0.5 %
 * slow, one 400 ms ahead and running 0.5 % fast (its keys expire 0.5 % early), one true. Rates
 * within the module's `driftFactor` (1 %): a lock's validity allows for them.
 */
export const SKEWED_CLOCKS: readonly (ClockSkew | undefined)[] = [
  { offsetMs: -400, rate: 0.995 },
  { offsetMs: 400, rate: 1.005 },
  undefined,
];

/** How each mode's rows are named in the report (standalone rows carry no prefix). */
export const MODE_LABELS: Record<ChaosMode, string> = {
  standalone: '',
  redlock: 'Redlock (3 nodes)',
  'redlock-clocks': 'Redlock (3 nodes, clocks ±400 ms, ±0.5 %)',
  cluster: 'Cluster (3 masters + replicas)',
  sentinel: 'Sentinel (master + replica)',
};

/** The network faults a scenario can put on one worker's connections (to every lock server). */
export interface WorkerLink {
  stall(): void;
  heal(): void;
  setLatency(ms: number): void;
  dropAll(): void;
}

/** What one run's lock servers hold after every worker has exited. */
export interface Leftovers {
  /** Locks still held (Redlock: by a majority of the nodes). */
  locks: number;
  keysWithoutTtl: number;
}

export interface LockTopology {
  /** How worker `slot` reaches the lock servers (through its own proxies). */
  workerLock(slot: number): WorkerLock;
  /** Each worker's link to the lock servers, by slot. */
  readonly links: readonly WorkerLink[];
  /** Freezes a lock server for `ms` (SIGSTOP): short of what would start a failover. */
  pauseRedis(ms: number): Promise<void>;
  /**
   * Kills a lock server and starts it empty after `downMs`. On Cluster and Sentinel it is a
   * master: its replica is promoted first, and it comes back as the new master's replica.
   */
  restartRedis(downMs: number): Promise<void>;
  leftovers(): Promise<Leftovers>;
  stop(): Promise<void>;
}

/**
 * A Redis fault on Cluster or Sentinel must stop short of a failover when it is a pause (at most
 * 2 × TTL = 2 s in the profiles), and become one when it is a crash.
 */
const FAILOVER_AFTER_MS = 2_500;
const sleep = (ms: number): Promise<void> => new Promise((resolve) => setTimeout(resolve, ms));
const pick = <T>(items: readonly T[]): T => items[Math.floor(Math.random() * items.length)];
const address = (port: number): Address => ({ host: '127.0.0.1', port });

/**
 * Every worker's proxies in front of `ports` (a restarted server keeps its port, so the proxies
 * never need to follow it): `proxies[slot][i]` forwards to `ports[i]`.
 */
async function proxiesFor(workers: number, ports: readonly number[]): Promise<FaultProxy[][]> {
  return Promise.all(
    Array.from({ length: workers }, () =>
      Promise.all(ports.map((port) => FaultProxy.start(() => port))),
    ),
  );
}

function linksOf(proxies: FaultProxy[][]): WorkerLink[] {
  return proxies.map((group) => ({
    stall: () => group.forEach((proxy) => proxy.stall()),
    heal: () => group.forEach((proxy) => proxy.heal()),
    setLatency: (ms) => group.forEach((proxy) => proxy.setLatency(ms)),
    dropAll: () => group.forEach((proxy) => proxy.dropAll()),
  }));
}

/** `host:port` of each server, as Cluster and Sentinel announce it → the worker's proxy for it. */
function natMap(ports: readonly number[], group: readonly FaultProxy[]): Record<string, Address> {
  return Object.fromEntries(ports.map((port, i) => [`127.0.0.1:${port}`, address(group[i].port)]));
}

/**
 * Lock keys (not fence counters, nor queues of waiting processes or a leadership's participants,
 * which lapse after their stay, nor a leadership's record, kept an hour on purpose) and keys
 * without a TTL on each of `servers`.
 */
async function scan(
  servers: readonly RedisServer[],
): Promise<{ locks: string[]; noTtl: number }[]> {
  return Promise.all(
    servers.map(async (server) => {
      const inspect = new Redis(server.port, server.host);
      try {
        const keys = await inspect.keys('*');
        const ttls = await Promise.all(keys.map((key) => inspect.pttl(key)));
        return {
          locks: keys.filter((key) => !/:(counter|turns|participants|leader)$/.test(key)),
          noTtl: ttls.filter((ttl) => ttl === -1).length,
        };
      } finally {
        inspect.disconnect();
      }
    }),
  );
}

async function closeAll(proxies: FaultProxy[][]): Promise<void> {
  await Promise.all(proxies.flat().map((proxy) => proxy.close()));
}

/**
 * One Redis (`count` 1) or Redlock's independent masters (3): Redis faults hit one of them at
 * random. A lock is left behind when a majority still holds it (a copy on one node whose release
 * failed while it restarted is no lock, and expires after its TTL).
 */
async function independentMasters(
  count: number,
  workers: number,
  clocks: readonly (ClockSkew | undefined)[] = [],
): Promise<LockTopology> {
  const servers = await Promise.all(
    Array.from({ length: count }, async (_, i) => {
      const clock = clocks[i];
      return startRedis([], clock && (await skewedClock(clock)));
    }),
  );
  const proxies = await proxiesFor(
    workers,
    servers.map((server) => server.port),
  );
  const urls = (slot: number): string[] =>
    proxies[slot].map((proxy) => `redis://127.0.0.1:${proxy.port}`);
  const victim = (): number => Math.floor(Math.random() * servers.length);
  return {
    workerLock: (slot) =>
      count === 1
        ? { mode: 'standalone', url: urls(slot)[0] }
        : { mode: 'redlock', urls: urls(slot) },
    links: linksOf(proxies),
    pauseRedis: async (ms) => {
      const server = servers[victim()];
      server.signal('SIGSTOP');
      await sleep(ms);
      server.signal('SIGCONT');
    },
    restartRedis: async (downMs) => {
      const node = victim();
      await servers[node].kill();
      await sleep(downMs);
      servers[node] = await servers[node].restart();
    },
    leftovers: async () => {
      const found = await scan(servers);
      const copies = new Map<string, number>();
      for (const { locks } of found)
        for (const key of locks) copies.set(key, (copies.get(key) ?? 0) + 1);
      return {
        locks: [...copies.values()].filter((n) => n > servers.length / 2).length,
        keysWithoutTtl: found.reduce((sum, { noTtl }) => sum + noTtl, 0),
      };
    },
    stop: async () => {
      await closeAll(proxies);
      await Promise.all(servers.map((server) => server.stop()));
    },
  };
}

/**
 * Three masters with a replica each. Redis faults hit the master of a hot key: a pause stays
 * shorter than the node timeout; a kill is failed over (the replica is promoted), and the killed
 * node comes back empty as the new master's replica, ready for the next crash.
 */
async function cluster(workers: number, lockKeys: readonly string[]): Promise<LockTopology> {
  const fixture = await startCluster(3, 1, FAILOVER_AFTER_MS);
  const ports = fixture.nodes.map((node) => node.port);
  const proxies = await proxiesFor(workers, ports);
  const hotMaster = async (): Promise<{ master: RedisServer; slot: number }> => {
    const slot = keySlot(pick(lockKeys));
    return { master: await fixture.ownerOf(slot), slot };
  };
  const masters = async (): Promise<RedisServer[]> => [...(await fixture.slotTable()).keys()];
  return {
    workerLock: (slot) => ({
      mode: 'cluster',
      startupNodes: proxies[slot].map((proxy) => address(proxy.port)),
      natMap: natMap(ports, proxies[slot]),
    }),
    links: linksOf(proxies),
    pauseRedis: async (ms) => {
      const { master } = await hotMaster();
      master.signal('SIGSTOP');
      await sleep(ms);
      master.signal('SIGCONT');
    },
    restartRedis: async (downMs) => {
      const { master: dead, slot } = await hotMaster();
      await dead.kill();
      let promoted: RedisServer | undefined;
      await until(async () => {
        const owner = await fixture.ownerOf(slot);
        promoted = owner === dead ? undefined : owner;
        return promoted !== undefined;
      }, `slot ${slot} was never failed over`);
      await sleep(downMs);
      await fixture.restartAsReplica(dead, promoted!);
    },
    leftovers: async () => {
      const found = await scan(await masters());
      return {
        locks: found.reduce((sum, { locks }) => sum + locks.length, 0),
        keysWithoutTtl: found.reduce((sum, { noTtl }) => sum + noTtl, 0),
      };
    },
    stop: async () => {
      await closeAll(proxies);
      await fixture.stop();
    },
  };
}

/**
 * A master, a replica and three Sentinels (quorum 2). The workers ask the Sentinels (directly)
 * for the master and reach the data nodes through their proxies. Redis faults hit the master: a
 * pause stays shorter than `down-after-milliseconds`; a kill is failed over, and the killed node
 * comes back empty as the new master's replica.
 */
async function sentinel(workers: number): Promise<LockTopology> {
  const group = await startSentinelGroup('chaos', FAILOVER_AFTER_MS);
  /** The data nodes; a restarted one takes its predecessor's place. */
  const data = [group.master, group.replica];
  const ports = data.map((node) => node.port);
  const proxies = await proxiesFor(workers, ports);
  const master = async (): Promise<RedisServer> => {
    const port = await group.masterPort();
    return data.find((node) => node.port === port)!;
  };
  return {
    workerLock: (slot) => ({
      mode: 'sentinel',
      sentinels: group.sentinels.map((node) => address(node.port)),
      name: group.name,
      natMap: natMap(ports, proxies[slot]),
    }),
    links: linksOf(proxies),
    pauseRedis: async (ms) => {
      const node = await master();
      node.signal('SIGSTOP');
      await sleep(ms);
      node.signal('SIGCONT');
    },
    restartRedis: async (downMs) => {
      const dead = await master();
      const next = data.find((node) => node !== dead)!;
      await dead.kill();
      await group.switchedTo(next.port, performance.now());
      await sleep(downMs);
      const fresh = await dead.restart();
      data[data.indexOf(dead)] = fresh;
      const replica = new Redis(fresh.port, fresh.host);
      try {
        await replica.replicaof(next.host, next.port);
        await until(
          async () => (await replica.info('replication')).includes('master_link_status:up'),
          `restarted node ${fresh.port} never synced`,
        );
      } finally {
        replica.disconnect();
      }
    },
    leftovers: async () => {
      const [found] = await scan([await master()]);
      return { locks: found.locks.length, keysWithoutTtl: found.noTtl };
    },
    stop: async () => {
      await closeAll(proxies);
      await group.stop();
      await Promise.all(data.map((node) => node.stop()));
    },
  };
}

/**
 * Starts the lock servers of `mode` for `workers` workers. `lockKeys` are the Redis keys of the
 * hot locks (Cluster faults hit their masters).
 */
export function startTopology(
  mode: ChaosMode,
  workers: number,
  lockKeys: readonly string[],
): Promise<LockTopology> {
  switch (mode) {
    case 'standalone':
      return independentMasters(1, workers);
    case 'redlock':
      return independentMasters(3, workers);
    case 'redlock-clocks':
      return independentMasters(3, workers, SKEWED_CLOCKS);
    case 'cluster':
      return cluster(workers, lockKeys);
    case 'sentinel':
      return sentinel(workers);
  }
}
