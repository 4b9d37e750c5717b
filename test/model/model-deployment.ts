import { Injectable } from '@nestjs/common';
import { Cluster, Redis } from 'ioredis';
import {
  LockAcquireTimeoutError,
  RedisLockModule,
  WithLock,
  type LockService,
  type RedisLockModuleOptions,
} from '../../lib/index.js';
import {
  InMemoryLockStore,
  RedisLockTestingModule,
  type RedisLockTestingOptions,
} from '../../lib/testing/index.js';
import { FaultProxy } from '../support/fault-proxy.js';
import { scriptsRunOn } from '../support/commandstats.js';
import { startLockModule } from '../support/lock-module.js';
import {
  startCluster,
  startRedis,
  type RedisClusterFixture,
  type RedisServer,
} from '../support/redis-server.js';

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
  /** When its shutdown began (`performance.now()`). */
  closedAt?: number;
  /**
   * For a call `maxWaiters` refused: how many other calls of `acquire()` and `using()` (the
   * decorator's too) were in flight then, on its key and in all, counting those that settled in
   * the same turn of the event loop (one socket read may settle several). At least the callers
   * `maxWaiters` counts: a refusal with fewer is a violation.
   */
  readonly othersInFlight: WeakMap<object, { perKey: number; perProcess: number }>;
  close(): Promise<void>;
}

/**
 * The apps' `maxWaiters`: small, so that a crowd of callers (12 at once on one key) meets it and
 * its refusals meet every other step.
 */
export const MODEL_MAX_WAITERS = { perKey: 8, perProcess: 20 };

/** Where the model's apps keep their locks, and the faults it can inject there. */
export interface Deployment {
  readonly name: string;
  /**
   * Whether the steps that inject Redis's faults (latency, a cut link, a paused or restarted
   * server, lost scripts, lost channels) apply: not to the in-memory store, which has none.
   */
  readonly faults: boolean;
  /** Whether semaphores and read/write locks exist here (not in Redlock mode). */
  readonly shapes: boolean;
  readonly commandTimeout: number;
  /** The servers `pauseNode` and `restartNode` pick from. */
  readonly nodes: number;
  /**
   * Starts a sequence: `variant` (its number) picks what varies from one to the next: the
   * apps' clients with an ioredis `keyPrefix` of their own or without (odd variants), and slot 0's
   * app handing a released lock to its own waiters for the default turn or never (`handoffTurn`
   * 0: every release names the next process, variants 2 and 3 of every 4; not in Redlock mode,
   * which passes nothing on in a process, where those variants put every node, not only the
   * first, behind slot 0's link).
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
  /**
   * How many scripts (`EVALSHA` and `EVAL`) each server has run since it started: read before
   * and after each step, to tell waiters that spin (see `SPIN_LIMIT`). Empty in memory.
   */
  scriptsRun(): Promise<number[]>;
  /** Every key the library wrote for the model keys of `prefix` (and fence counters), with PTTL. */
  ttls(prefix: string): Promise<[string, number][]>;
  /** Faults on slot 0's link to Redis (in Redlock mode, to its first node). */
  latency(ms: number): void;
  stall(): void;
  heal(): void;
  /** Whether slot 0's link is cut now. */
  readonly stalled: boolean;
  /**
   * Redis forgets its scripts (every node), as after a restart or a failover; then `reload` are
   * loaded again (another client used them since).
   */
  flushScripts(reload: readonly string[]): Promise<void>;
  /** Stops server `node` for everyone for `ms` (`CLIENT PAUSE`). */
  pauseNode(node: number, ms: number): Promise<void>;
  /**
   * Whether the apps' Redis user may use the lock channels (every node): denied, it is the
   * least-privilege user without `&lock:*` (Redis 7's default for a new user), whose releases
   * cannot announce and whose subscriptions Redis drops; allowed again, as an operator's fix.
   */
  channels(allowed: boolean): Promise<void>;
  /** Redlock mode: restarts node `node` empty (on its port), and resolves once it is back. */
  restartNode?(node: number): Promise<void>;
  /** Redlock mode: the tokens with a copy of a model key on each node. */
  perNode?(key: string): Promise<string[][]>;
  /**
   * Redlock mode: node `node`'s fence counter moves `us` ahead, as on a node whose clock runs
   * ahead of the others' (where there is a counter: one written without a TTL would outlive the
   * sequence), so that its fences exceed the floor the apps propose (see
   * `RedlockBackend.fenceFloor`) until they learn the lead.
   */
  counterAhead?(node: number, us: number): Promise<void>;
  /**
   * Redlock mode: node `node` runs out of memory for `ms` (`maxmemory` 1 byte): it answers every
   * lock script with an error at once, a refusal that costs no time, unlike a paused node's.
   */
  outOfMemory?(node: number, ms: number): Promise<void>;
  stop(): Promise<void>;
}

/** The default user (the apps') may use every channel, or none (see `Deployment.channels`). */
async function grantChannels(redis: Redis, allowed: boolean): Promise<void> {
  await redis.call('ACL', 'SETUSER', 'default', allowed ? 'allchannels' : 'resetchannels');
}

/** One server forgets its scripts, then loads `reload` again (see `Deployment.flushScripts`). */
async function forget(redis: Redis, reload: readonly string[]): Promise<void> {
  await redis.script('FLUSH');
  for (const script of reload) await redis.script('LOAD', script);
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

/**
 * An app of `options` (`close` also runs `after`, for clients the test made), or of the testing
 * module with them when they name a `store`.
 */
async function appOf(
  slot: number,
  generation: number,
  options: RedisLockModuleOptions | RedisLockTestingOptions,
  after?: () => void,
): Promise<App> {
  const withWaiters = { ...options, maxWaiters: MODEL_MAX_WAITERS };
  const fixture = await startLockModule(
    'store' in withWaiters
      ? RedisLockTestingModule.forRoot(withWaiters)
      : RedisLockModule.forRoot(withWaiters),
    [ModelJobs],
  );
  const othersInFlight = countCalls(fixture.locks);
  const app: App = {
    slot,
    generation,
    locks: fixture.locks,
    jobs: fixture.module.get(ModelJobs),
    othersInFlight,
    closing: false,
    close: async () => {
      app.closing = true;
      app.closedAt ??= performance.now();
      try {
        await fixture.close();
      } finally {
        after?.();
      }
    },
  };
  return app;
}

/**
 * Counts the calls of `acquire()` and `using()` on `locks` in flight, by wrapping the instance's
 * own methods (`@WithLock` calls them on the same instance), and notes for each call refused by
 * `maxWaiters` how many others were in flight (see `App.othersInFlight`).
 */
function countCalls(locks: LockService): App['othersInFlight'] {
  const now = { total: 0, perKey: new Map<string, number>() };
  const recent = { total: 0, perKey: new Map<string, number>() };
  let clearing = false;
  const keysOf = (key: unknown): string[] =>
    Array.isArray(key)
      ? [...new Set(key.filter((k): k is string => typeof k === 'string'))]
      : typeof key === 'string'
        ? [key]
        : [];
  const add = (counts: typeof now, keys: string[], by: number): void => {
    counts.total += by;
    for (const key of keys) counts.perKey.set(key, (counts.perKey.get(key) ?? 0) + by);
  };
  const refusals = new WeakMap<object, { perKey: number; perProcess: number }>();
  for (const name of ['acquire', 'using'] as const) {
    const original = (locks[name] as (...args: unknown[]) => Promise<unknown>).bind(locks);
    Object.defineProperty(locks, name, {
      value: (...args: unknown[]): Promise<unknown> => {
        const keys = keysOf(args[0]);
        add(now, keys, 1);
        return original(...args).then(
          (value) => {
            settled(keys);
            return value;
          },
          (error: unknown) => {
            if (error instanceof LockAcquireTimeoutError && error.queueFull) {
              const count = (counts: typeof now): number => counts.perKey.get(error.key) ?? 0;
              refusals.set(error, {
                perKey: count(now) - 1 + count(recent),
                perProcess: now.total - 1 + recent.total,
              });
            }
            settled(keys);
            throw error;
          },
        );
      },
    });
  }
  function settled(keys: string[]): void {
    add(now, keys, -1);
    add(recent, keys, 1);
    if (clearing) return;
    clearing = true;
    setImmediate(() => {
      clearing = false;
      recent.total = 0;
      recent.perKey.clear();
    });
  }
  return refusals;
}

/** Slot 0's link: a proxy in front of each of `ports`, faulted together. */
class Link {
  stalled = false;
  private constructor(readonly proxies: readonly FaultProxy[]) {}

  static async to(ports: readonly number[]): Promise<Link> {
    return new Link(await Promise.all(ports.map((port) => FaultProxy.start(() => port))));
  }

  latency(ms: number): void {
    for (const proxy of this.proxies) proxy.setLatency(ms);
  }

  stall(): void {
    this.stalled = true;
    for (const proxy of this.proxies) proxy.stall();
  }

  heal(): void {
    this.stalled = false;
    for (const proxy of this.proxies) proxy.heal();
  }

  async close(): Promise<void> {
    this.latency(0);
    this.heal();
    await Promise.all(this.proxies.map((proxy) => proxy.close()));
  }
}

/** Stops `redis` for everyone for `ms` (`CLIENT PAUSE`), and resolves when it is over. */
async function pause(redis: Redis, ms: number): Promise<void> {
  await redis.call('CLIENT', 'PAUSE', String(ms), 'ALL');
  await new Promise((resolve) => setTimeout(resolve, ms));
}

/** What every deployment shares: slot 0's link, and the client prefix of every other sequence. */
abstract class Linked implements Deployment {
  clientPrefix = '';
  readonly faults = true;
  abstract readonly name: string;
  abstract readonly shapes: boolean;
  abstract readonly nodes: number;

  constructor(
    readonly commandTimeout: number,
    protected readonly link: Link,
    /** The client `keyPrefix` of every other sequence. */
    private readonly prefix: string,
  ) {}

  begin(variant: number): void {
    this.clientPrefix = variant % 2 === 1 ? this.prefix : '';
    this.turn = variant % 4 >= 2 ? { handoffTurn: 0 } : {};
  }

  /** Slot 0's `handoffTurn` in this sequence (see `Deployment.begin`). */
  private turn: { handoffTurn?: number } = {};

  /** What `slot`'s app takes of the sequence's variant. */
  protected variantOf(slot: number): { handoffTurn?: number } {
    return slot === 0 ? this.turn : {};
  }

  get stalled(): boolean {
    return this.link.stalled;
  }

  latency(ms: number): void {
    this.link.latency(ms);
  }

  stall(): void {
    this.link.stall();
  }

  heal(): void {
    this.link.heal();
  }

  /** The name of a model key's lock in Redis. */
  protected lockName(key: string): string {
    return `${this.clientPrefix}lock:{${key}}`;
  }

  abstract startApp(slot: number, generation: number): Promise<App>;
  abstract owner(key: string): Promise<string[]>;
  abstract copies(key: string): Promise<string[]>;
  abstract scriptsRun(): Promise<number[]>;
  abstract ttls(prefix: string): Promise<[string, number][]>;
  abstract flushScripts(reload: readonly string[]): Promise<void>;
  abstract pauseNode(node: number, ms: number): Promise<void>;
  abstract channels(allowed: boolean): Promise<void>;
  abstract stop(): Promise<void>;
}

/**
 * One redis-server; slot 0 through a fault proxy, slot 1 direct. Every other sequence, both apps'
 * clients have an ioredis `keyPrefix` of their own (`app:`).
 */
class Standalone extends Linked {
  readonly name = 'one Redis';
  readonly shapes = true;
  readonly nodes = 1;
  private readonly redis: Redis;

  constructor(
    commandTimeout: number,
    private readonly server: RedisServer,
    link: Link,
  ) {
    super(commandTimeout, link, 'app:');
    this.redis = new Redis(server.port, '127.0.0.1');
  }

  startApp(slot: number, generation: number): Promise<App> {
    const port = slot === 0 ? this.link.proxies[0].port : this.server.port;
    const keyPrefix = this.clientPrefix || undefined;
    const connection = { host: '127.0.0.1', port, keyPrefix };
    return appOf(slot, generation, {
      connection,
      commandTimeout: this.commandTimeout,
      ...this.variantOf(slot),
    });
  }

  owner(key: string): Promise<string[]> {
    return tokensOf(this.redis, this.lockName(key));
  }

  copies(key: string): Promise<string[]> {
    return this.owner(key);
  }

  scriptsRun(): Promise<number[]> {
    return scriptsRunOn([this.redis]);
  }

  ttls(prefix: string): Promise<[string, number][]> {
    return keyTtls(this.redis, prefix);
  }

  async flushScripts(reload: readonly string[]): Promise<void> {
    await forget(this.redis, reload);
  }

  pauseNode(_node: number, ms: number): Promise<void> {
    return pause(this.redis, ms);
  }

  channels(allowed: boolean): Promise<void> {
    return grantChannels(this.redis, allowed);
  }

  async stop(): Promise<void> {
    this.redis.disconnect();
    await this.link.close();
    await this.server.stop();
  }
}

export async function standalone(commandTimeout: number): Promise<Deployment> {
  const server = await startRedis();
  return new Standalone(commandTimeout, server, await Link.to([server.port]));
}

/**
 * Redlock mode on three redis-servers: slot 0 reaches the first through a fault proxy. Every other
 * sequence, the nodes' clients have an ioredis `keyPrefix` of their own (`app:`). A node can be
 * paused, or restarted empty.
 */
class Redlock extends Linked {
  readonly name = 'Redlock, 3 nodes';
  readonly shapes = false;
  readonly nodes = 3;
  private readonly direct: Redis[];

  constructor(
    commandTimeout: number,
    private readonly servers: RedisServer[],
    link: Link,
  ) {
    super(commandTimeout, link, 'app:');
    this.direct = servers.map((server) =>
      new Redis(server.port, '127.0.0.1').on('error', () => {
        // A node restarts in some sequences: the test's own client reconnects quietly.
      }),
    );
  }

  /**
   * Whether slot 0's app reaches every node through its link (two sequences in every four), not
   * only node 0: its latency and partitions then slow or cut its whole majority (a grant that
   * comes after its lease, while the other app takes the same own token, found by a helper).
   */
  private everyNode = false;

  override begin(variant: number): void {
    super.begin(variant);
    this.everyNode = variant % 4 >= 2;
  }

  startApp(slot: number, generation: number): Promise<App> {
    const nodes = this.servers.map((server, i) => ({
      host: '127.0.0.1',
      port: slot === 0 && (i === 0 || this.everyNode) ? this.link.proxies[i].port : server.port,
      keyPrefix: this.clientPrefix || undefined,
    }));
    // No handoffTurn: Redlock passes nothing on in a process (the option is refused with nodes).
    return appOf(slot, generation, { nodes, commandTimeout: this.commandTimeout });
  }

  /** What `read` answers on each node (`undefined` where it fails: a node restarting). */
  private each<T>(read: (redis: Redis) => Promise<T>): Promise<(T | undefined)[]> {
    return Promise.all(this.direct.map((redis) => read(redis).catch(() => undefined)));
  }

  async perNode(key: string): Promise<string[][]> {
    const held = await this.each((redis) => tokensOf(redis, this.lockName(key)));
    return held.map((tokens) => tokens ?? []);
  }

  async owner(key: string): Promise<string[]> {
    const held = (await this.perNode(key)).flat();
    return [...new Set(held)].filter((token) => held.filter((t) => t === token).length >= 2);
  }

  async copies(key: string): Promise<string[]> {
    return [...new Set((await this.perNode(key)).flat())];
  }

  scriptsRun(): Promise<number[]> {
    return scriptsRunOn(this.direct);
  }

  async ttls(prefix: string): Promise<[string, number][]> {
    return (await this.each((redis) => keyTtls(redis, prefix))).flatMap((ttls) => ttls ?? []);
  }

  async flushScripts(reload: readonly string[]): Promise<void> {
    await this.each((redis) => forget(redis, reload));
  }

  pauseNode(node: number, ms: number): Promise<void> {
    return pause(this.direct[node], ms);
  }

  async channels(allowed: boolean): Promise<void> {
    // A node restarting comes back with its default user's channels allowed.
    await this.each((redis) => grantChannels(redis, allowed));
  }

  async counterAhead(node: number, us: number): Promise<void> {
    const counter = `${this.clientPrefix}lock:{}:counter`;
    await this.direct[node]
      .eval(
        "if redis.call('EXISTS', KEYS[1]) == 1 then redis.call('INCRBY', KEYS[1], ARGV[1]) end",
        1,
        counter,
        us,
      )
      .catch(() => undefined); // a node restarting: nothing moves
  }

  async outOfMemory(node: number, ms: number): Promise<void> {
    const limit = (bytes: string): Promise<unknown> =>
      this.direct[node].config('SET', 'maxmemory', bytes).catch(() => undefined);
    await limit('1');
    await new Promise((resolve) => setTimeout(resolve, ms));
    await limit('0'); // (a node restarted meanwhile came back without the limit)
  }

  async restartNode(node: number): Promise<void> {
    await this.servers[node].kill();
    this.servers[node] = await this.servers[node].restart();
    // The node's clients (the apps', the test's) find it again within their retry strategy.
    const deadline = performance.now() + 5_000;
    while ((await this.direct[node].ping().catch(() => '')) !== 'PONG') {
      if (performance.now() > deadline) throw new Error(`node ${node} did not come back`);
      await new Promise((resolve) => setTimeout(resolve, 50));
    }
  }

  async stop(): Promise<void> {
    for (const redis of this.direct) redis.disconnect();
    await this.link.close();
    await Promise.all(this.servers.map((server) => server.stop()));
  }
}

export async function redlock(commandTimeout: number): Promise<Deployment> {
  const servers = await Promise.all([0, 1, 2].map(() => startRedis()));
  return new Redlock(commandTimeout, servers, await Link.to(servers.map((server) => server.port)));
}

/**
 * A Cluster of three masters: slot 0's client reaches every node through a fault proxy of its own
 * (ioredis `natMap`). Every other sequence, both apps' clients have a `keyPrefix` with a hash tag
 * of its own (`{app}:`, which puts every lock in one slot).
 */
class ClusterOfThree extends Linked {
  readonly name = 'Cluster, 3 masters';
  readonly shapes = true;
  readonly nodes = 3;
  private readonly inspect: Cluster;
  private readonly direct: Redis[];

  constructor(
    commandTimeout: number,
    private readonly fixture: RedisClusterFixture,
    link: Link,
  ) {
    super(commandTimeout, link, '{app}:');
    this.inspect = new Cluster(this.startupNodes);
    this.direct = fixture.nodes.map((node) => new Redis(node.port, node.host));
  }

  private get startupNodes(): { host: string; port: number }[] {
    return this.fixture.nodes.map((node) => ({ host: '127.0.0.1', port: node.port }));
  }

  startApp(slot: number, generation: number): Promise<App> {
    const keyPrefix = this.clientPrefix || undefined;
    const natMap = Object.fromEntries(
      this.fixture.nodes.map((node, i) => [
        `127.0.0.1:${node.port}`,
        { host: '127.0.0.1', port: this.link.proxies[i].port },
      ]),
    );
    const client =
      slot === 0
        ? new Cluster(
            this.link.proxies.map((proxy) => ({ host: '127.0.0.1', port: proxy.port })),
            { natMap, keyPrefix },
          )
        : new Cluster(this.startupNodes, { keyPrefix });
    const options = { client, commandTimeout: this.commandTimeout, ...this.variantOf(slot) };
    return appOf(slot, generation, options, () => client.disconnect());
  }

  owner(key: string): Promise<string[]> {
    return tokensOf(this.inspect, this.lockName(key));
  }

  copies(key: string): Promise<string[]> {
    return this.owner(key);
  }

  scriptsRun(): Promise<number[]> {
    return scriptsRunOn(this.direct);
  }

  async ttls(prefix: string): Promise<[string, number][]> {
    return (await Promise.all(this.direct.map((redis) => keyTtls(redis, prefix)))).flat();
  }

  async flushScripts(reload: readonly string[]): Promise<void> {
    await Promise.all(this.direct.map((redis) => forget(redis, reload)));
  }

  pauseNode(node: number, ms: number): Promise<void> {
    return pause(this.direct[node], ms);
  }

  async channels(allowed: boolean): Promise<void> {
    await Promise.all(this.direct.map((redis) => grantChannels(redis, allowed)));
  }

  async stop(): Promise<void> {
    this.inspect.disconnect();
    for (const redis of this.direct) redis.disconnect();
    await this.link.close();
    await this.fixture.stop();
  }
}

export async function cluster(commandTimeout: number): Promise<Deployment> {
  const fixture = await startCluster(3);
  return new ClusterOfThree(
    commandTimeout,
    fixture,
    await Link.to(fixture.nodes.map((node) => node.port)),
  );
}

/**
 * `RedisLockTestingModule`: both apps of a sequence share one `InMemoryLockStore` (a new one per
 * sequence), as two instances share one Redis. No faults: the steps that inject them are left out.
 */
class InMemory implements Deployment {
  readonly name = 'in memory (RedisLockTestingModule)';
  readonly faults = false;
  readonly shapes = true;
  readonly nodes = 1;
  readonly clientPrefix = '';
  readonly stalled = false;
  private store = new InMemoryLockStore();

  constructor(readonly commandTimeout: number) {}

  begin(): void {
    this.store = new InMemoryLockStore();
  }

  startApp(slot: number, generation: number): Promise<App> {
    return appOf(slot, generation, { store: this.store, commandTimeout: this.commandTimeout });
  }

  async owner(key: string): Promise<string[]> {
    const name = `lock:{${key}}`;
    return this.store.contents(name).find((found) => found.name === name)?.holders ?? [];
  }

  copies(key: string): Promise<string[]> {
    return this.owner(key);
  }

  async scriptsRun(): Promise<number[]> {
    return [];
  }

  async ttls(prefix: string): Promise<[string, number][]> {
    return this.store
      .contents('')
      .filter((found) => found.name.includes(prefix))
      .map((found): [string, number] => [found.name, found.ttl]);
  }

  /** Nothing to forget: every sequence begins with it (see `runSequence`). */
  async flushScripts(): Promise<void> {}

  /** Only the healing `settle` asks for (0 ms). */
  latency(ms: number): void {
    if (ms > 0) throw new Error('no faults in memory');
  }
  stall(): void {
    throw new Error('no faults in memory');
  }
  heal(): void {}
  pauseNode(): Promise<void> {
    throw new Error('no faults in memory');
  }
  /** Only the healing `settle` asks for (allowed). */
  async channels(allowed: boolean): Promise<void> {
    if (!allowed) throw new Error('no faults in memory');
  }
  async stop(): Promise<void> {}
}

export function inMemory(commandTimeout: number): Promise<Deployment> {
  return Promise.resolve(new InMemory(commandTimeout));
}
