import { Injectable } from '@nestjs/common';
import { Cluster, Redis } from 'ioredis';
import { WithLock, type LockService, type RedisLockModuleOptions } from '../../lib/index.js';
import { FaultProxy } from '../support/fault-proxy.js';
import { startLockModule } from '../support/lock-module.js';
import { startCluster, startRedis, type RedisServer } from '../support/redis-server.js';

/** Scheduled jobs as the model runs them: `@WithLock` with `onBusy: 'skip'`, the body the model's. */
@Injectable()
export class ModelJobs {
  @WithLock({ key: '{0}', onBusy: 'skip', ttl: 1_000 })
  async one(_key: string, body: () => Promise<void>): Promise<'ran'> {
    await body();
    return 'ran';
  }

  @WithLock({ key: '{0}', onBusy: 'skip', ttl: 1_000, holdAtLeast: 200 })
  async oneHeld(_key: string, body: () => Promise<void>): Promise<'ran'> {
    await body();
    return 'ran';
  }

  @WithLock({ key: ['{0}', '{1}'], onBusy: 'skip', ttl: 10_000, holdAtLeast: 5_000 })
  async both(_a: string, _b: string, body: () => Promise<void>): Promise<'ran'> {
    await body();
    return 'ran';
  }
}

/** One instance of the app: slot 0 reaches Redis through a link the model can slow or cut. */
export interface App {
  readonly slot: number;
  readonly generation: number;
  readonly locks: LockService;
  readonly jobs: ModelJobs;
  /** Its shutdown has begun: its calls may fail with `RedisLockShutdownError`. */
  closing: boolean;
  close(): Promise<void>;
}

/** Where the model's apps keep their locks, and the faults it can inject there. */
export interface Deployment {
  readonly name: string;
  /** Whether semaphores and read/write locks exist here (not in Redlock mode). */
  readonly shapes: boolean;
  readonly commandTimeout: number;
  /** The servers `pauseNode` and `restartNode` pick from. */
  readonly nodes: number;
  /**
   * Starts a sequence: `variant` (its number) picks what varies from one to the next, the
   * apps' clients with an ioredis `keyPrefix` of their own or without.
   */
  begin(variant: number): void;
  /** What the sequence's clients prefix keys with (the library's keys are under it). */
  readonly clientPrefix: string;
  startApp(slot: number, generation: number): Promise<App>;
  /**
   * The tokens that hold a model key now (in Redlock mode, on a majority of nodes): a plain
   * lock's owner, a semaphore's live places, a read lock's live readers.
   */
  owner(key: string): Promise<string[]>;
  /** The tokens with any copy of a model key (in Redlock mode, on any node). */
  copies(key: string): Promise<string[]>;
  /** Every key the library wrote for the model keys of `prefix` (and fence counters), with PTTL. */
  ttls(prefix: string): Promise<[string, number][]>;
  /** Faults on slot 0's link to Redis (in Redlock mode, to its first node). */
  latency(ms: number): void;
  stall(): void;
  heal(): void;
  /** Whether slot 0's link is cut now. */
  readonly stalled: boolean;
  /** Redis forgets its scripts (every node), as after a restart or a failover. */
  flushScripts(): Promise<void>;
  /** Stops server `node` for everyone for `ms` (`CLIENT PAUSE`). */
  pauseNode(node: number, ms: number): Promise<void>;
  /** Redlock mode: restarts node `node` empty (on its port), and resolves once it is back. */
  restartNode?(node: number): Promise<void>;
  /** Redlock mode: the tokens with a copy of a model key on each node. */
  perNode?(key: string): Promise<string[][]>;
  stop(): Promise<void>;
}

/** The tokens holding `name` on one server (a plain lock, a semaphore's or readers' live ones). */
async function tokensOf(redis: Redis | Cluster, name: string): Promise<string[]> {
  const type = await redis.type(name);
  if (type === 'string') return [(await redis.get(name))!];
  // Places and readers carry their expiry (server ms): a lapsed one is dropped lazily.
  const [seconds, micros] = await (redis as Redis).time();
  const now = Number(seconds) * 1_000 + Math.floor(Number(micros) / 1_000);
  if (type === 'zset') return redis.zrangebyscore(name, `(${now}`, '+inf');
  if (type !== 'hash') return [];
  const fields = await redis.hgetall(name);
  return Object.keys(fields).filter((field) => field !== '' && Number(fields[field]) > now);
}

/** Every key on `redis` of the model keys of `prefix`, and the fence counters, with its PTTL. */
async function keyTtls(redis: Redis, prefix: string): Promise<[string, number][]> {
  const names = (await redis.keys('*')).filter(
    (name) => name.includes(prefix) || name.endsWith(':counter'),
  );
  const ttls = await Promise.all(names.map((name) => redis.pttl(name)));
  return names.map((name, i): [string, number] => [name, ttls[i]]);
}

/** An app of `options` (`close` also runs `after`, for clients the test made). */
async function appOf(
  slot: number,
  generation: number,
  options: RedisLockModuleOptions,
  after?: () => void,
): Promise<App> {
  const fixture = await startLockModule(options, [ModelJobs]);
  const app: App = {
    slot,
    generation,
    locks: fixture.locks,
    jobs: fixture.module.get(ModelJobs),
    closing: false,
    close: async () => {
      app.closing = true;
      try {
        await fixture.close();
      } finally {
        after?.();
      }
    },
  };
  return app;
}

/** Slot 0's link: a proxy in front of each of `ports`, faulted together. */
async function linkTo(ports: readonly number[]) {
  const proxies = await Promise.all(ports.map((_, i) => FaultProxy.start(() => ports[i])));
  let stalled = false;
  return {
    proxies,
    latency: (ms: number) => proxies.forEach((proxy) => proxy.setLatency(ms)),
    stall: () => {
      stalled = true;
      proxies.forEach((proxy) => proxy.stall());
    },
    heal: () => {
      stalled = false;
      proxies.forEach((proxy) => proxy.heal());
    },
    get stalled() {
      return stalled;
    },
    close: async () => {
      for (const proxy of proxies) {
        proxy.setLatency(0);
        proxy.heal();
      }
      await Promise.all(proxies.map((proxy) => proxy.close()));
    },
  };
}

/**
 * One redis-server; slot 0 through a fault proxy, slot 1 direct. Every other sequence, both apps'
 * clients have an ioredis `keyPrefix` of their own (`app:`).
 */
export async function standalone(commandTimeout: number): Promise<Deployment> {
  const server: RedisServer = await startRedis();
  const link = await linkTo([server.port]);
  const redis = new Redis(server.port, '127.0.0.1');
  let clientPrefix = '';
  return {
    name: 'one Redis',
    shapes: true,
    commandTimeout,
    nodes: 1,
    begin(variant) {
      clientPrefix = variant % 2 === 1 ? 'app:' : '';
    },
    get clientPrefix() {
      return clientPrefix;
    },
    startApp(slot, generation) {
      const port = slot === 0 ? link.proxies[0].port : server.port;
      const connection = { host: '127.0.0.1', port, keyPrefix: clientPrefix || undefined };
      return appOf(slot, generation, { connection, commandTimeout });
    },
    owner: (key) => tokensOf(redis, `${clientPrefix}lock:{${key}}`),
    copies: (key) => tokensOf(redis, `${clientPrefix}lock:{${key}}`),
    ttls: (prefix) => keyTtls(redis, prefix),
    latency: link.latency,
    stall: link.stall,
    heal: link.heal,
    get stalled() {
      return link.stalled;
    },
    async flushScripts() {
      await redis.script('FLUSH');
    },
    async pauseNode(_node, ms) {
      await redis.call('CLIENT', 'PAUSE', String(ms), 'ALL');
      await new Promise((resolve) => setTimeout(resolve, ms));
    },
    async stop() {
      redis.disconnect();
      await link.close();
      await server.stop();
    },
  };
}

/**
 * Redlock mode on three redis-servers: slot 0 reaches the first through a fault proxy. Every
 * other sequence, the nodes' clients have an ioredis `keyPrefix` of their own (`app:`). A node
 * can be paused, or restarted empty.
 */
export async function redlock(commandTimeout: number): Promise<Deployment> {
  const servers = await Promise.all([0, 1, 2].map(() => startRedis()));
  const link = await linkTo([servers[0].port]);
  const direct = servers.map((server) =>
    new Redis(server.port, '127.0.0.1').on('error', () => {
      // A node restarts in some sequences: the test's own client reconnects quietly.
    }),
  );
  let clientPrefix = '';
  const each = <T>(read: (redis: Redis) => Promise<T>): Promise<(T | undefined)[]> =>
    Promise.all(direct.map((redis) => read(redis).catch(() => undefined)));
  const perNode = async (key: string): Promise<string[][]> => {
    const held = await each((redis) => tokensOf(redis, `${clientPrefix}lock:{${key}}`));
    return held.map((tokens) => tokens ?? []);
  };
  return {
    name: 'Redlock, 3 nodes',
    shapes: false,
    commandTimeout,
    nodes: 3,
    begin(variant) {
      clientPrefix = variant % 2 === 1 ? 'app:' : '';
    },
    get clientPrefix() {
      return clientPrefix;
    },
    startApp(slot, generation) {
      const nodes = servers.map((server, i) => ({
        host: '127.0.0.1',
        port: slot === 0 && i === 0 ? link.proxies[0].port : server.port,
        keyPrefix: clientPrefix || undefined,
      }));
      return appOf(slot, generation, { nodes, commandTimeout });
    },
    async owner(key) {
      const held = (await perNode(key)).flat();
      return [...new Set(held)].filter((token) => held.filter((t) => t === token).length >= 2);
    },
    async copies(key) {
      return [...new Set((await perNode(key)).flat())];
    },
    perNode,
    async ttls(prefix) {
      return (await each((redis) => keyTtls(redis, prefix))).flatMap((ttls) => ttls ?? []);
    },
    latency: link.latency,
    stall: link.stall,
    heal: link.heal,
    get stalled() {
      return link.stalled;
    },
    async flushScripts() {
      await each((redis) => redis.script('FLUSH'));
    },
    async pauseNode(node, ms) {
      await direct[node].call('CLIENT', 'PAUSE', String(ms), 'ALL');
      await new Promise((resolve) => setTimeout(resolve, ms));
    },
    async restartNode(node) {
      await servers[node].kill();
      servers[node] = await servers[node].restart();
      // The node's clients (the apps', the test's) find it again within their retry strategy.
      const deadline = performance.now() + 5_000;
      while ((await direct[node].ping().catch(() => '')) !== 'PONG') {
        if (performance.now() > deadline) throw new Error(`node ${node} did not come back`);
        await new Promise((resolve) => setTimeout(resolve, 50));
      }
    },
    async stop() {
      for (const redis of direct) redis.disconnect();
      await link.close();
      await Promise.all(servers.map((server) => server.stop()));
    },
  };
}

/**
 * A Cluster of three masters: slot 0's client reaches every node through a fault proxy of its own
 * (ioredis `natMap`). Every other sequence, both apps' clients have a `keyPrefix` with a hash tag
 * of its own (`{app}:`, which puts every lock in one slot).
 */
export async function cluster(commandTimeout: number): Promise<Deployment> {
  const fixture = await startCluster(3);
  const ports = fixture.nodes.map((node) => node.port);
  const link = await linkTo(ports);
  const startupNodes = ports.map((port) => ({ host: '127.0.0.1', port }));
  const natMap = Object.fromEntries(
    ports.map((port, i) => [
      `127.0.0.1:${port}`,
      { host: '127.0.0.1', port: link.proxies[i].port },
    ]),
  );
  const inspect = new Cluster(startupNodes);
  const direct = fixture.nodes.map((node) => new Redis(node.port, node.host));
  let clientPrefix = '';
  return {
    name: 'Cluster, 3 masters',
    shapes: true,
    commandTimeout,
    nodes: 3,
    begin(variant) {
      clientPrefix = variant % 2 === 1 ? '{app}:' : '';
    },
    get clientPrefix() {
      return clientPrefix;
    },
    startApp(slot, generation) {
      const keyPrefix = clientPrefix || undefined;
      const client =
        slot === 0
          ? new Cluster(
              link.proxies.map((proxy) => ({ host: '127.0.0.1', port: proxy.port })),
              { natMap, keyPrefix },
            )
          : new Cluster(startupNodes, { keyPrefix });
      return appOf(slot, generation, { client, commandTimeout }, () => client.disconnect());
    },
    owner: (key) => tokensOf(inspect, `${clientPrefix}lock:{${key}}`),
    copies: (key) => tokensOf(inspect, `${clientPrefix}lock:{${key}}`),
    async ttls(prefix) {
      return (await Promise.all(direct.map((redis) => keyTtls(redis, prefix)))).flat();
    },
    latency: link.latency,
    stall: link.stall,
    heal: link.heal,
    get stalled() {
      return link.stalled;
    },
    async flushScripts() {
      await Promise.all(direct.map((redis) => redis.script('FLUSH')));
    },
    async pauseNode(node, ms) {
      await direct[node].call('CLIENT', 'PAUSE', String(ms), 'ALL');
      await new Promise((resolve) => setTimeout(resolve, ms));
    },
    async stop() {
      inspect.disconnect();
      for (const redis of direct) redis.disconnect();
      await link.close();
      await fixture.stop();
    },
  };
}
