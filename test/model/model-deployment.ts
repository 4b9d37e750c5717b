import { Injectable } from '@nestjs/common';
import { Redis } from 'ioredis';
import { WithLock, type LockService, type RedisLockModuleOptions } from '../../lib/index.js';
import { FaultProxy } from '../support/fault-proxy.js';
import { startLockModule } from '../support/lock-module.js';
import { startRedis, type RedisServer } from '../support/redis-server.js';

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
  startApp(slot: number, generation: number): Promise<App>;
  /**
   * The tokens Redis holds under a model key: a plain lock's owner, a semaphore's places, a read
   * lock's readers.
   */
  owner(key: string): Promise<string[]>;
  /** Every key the library wrote for the model keys of `prefix`, with its PTTL. */
  ttls(prefix: string): Promise<[string, number][]>;
  /** Faults on slot 0's link to Redis. */
  latency(ms: number): void;
  stall(): void;
  heal(): void;
  /** Whether slot 0's link is cut now. */
  readonly stalled: boolean;
  /** Redis forgets its scripts (as after a restart or a failover). */
  flushScripts(): Promise<void>;
  stop(): Promise<void>;
}

/** One redis-server; slot 0 through a fault proxy, slot 1 direct. */
export async function standalone(commandTimeout: number): Promise<Deployment> {
  const server: RedisServer = await startRedis();
  const proxy = await FaultProxy.start(() => server.port);
  const redis = new Redis(server.port, '127.0.0.1');
  let stalled = false;
  const options = (slot: number): RedisLockModuleOptions => ({
    connection: slot === 0 ? `redis://127.0.0.1:${proxy.port}` : server.url,
    commandTimeout,
  });
  return {
    name: 'one Redis',
    shapes: true,
    commandTimeout,
    async startApp(slot, generation) {
      const fixture = await startLockModule(options(slot), [ModelJobs]);
      const app: App = {
        slot,
        generation,
        locks: fixture.locks,
        jobs: fixture.module.get(ModelJobs),
        closing: false,
        close: () => {
          app.closing = true;
          return fixture.close();
        },
      };
      return app;
    },
    async owner(key) {
      const name = `lock:{${key}}`;
      const type = await redis.type(name);
      if (type === 'string') return [(await redis.get(name))!];
      // Places and readers carry their expiry (server ms): a lapsed one is dropped lazily.
      const [seconds, micros] = await redis.time();
      const now = Number(seconds) * 1_000 + Math.floor(Number(micros) / 1_000);
      if (type === 'zset') return redis.zrangebyscore(name, `(${now}`, '+inf');
      if (type !== 'hash') return [];
      const fields = await redis.hgetall(name);
      return Object.keys(fields).filter((field) => field !== '' && Number(fields[field]) > now);
    },
    async ttls(prefix) {
      const names = [...(await redis.keys(`lock:{${prefix}*`)), 'lock:{}:counter'];
      const ttls = await Promise.all(names.map((name) => redis.pttl(name)));
      return names.map((name, i): [string, number] => [name, ttls[i]]);
    },
    latency(ms) {
      proxy.setLatency(ms);
    },
    stall() {
      stalled = true;
      proxy.stall();
    },
    heal() {
      stalled = false;
      proxy.heal();
    },
    get stalled() {
      return stalled;
    },
    async flushScripts() {
      await redis.script('FLUSH');
    },
    async stop() {
      proxy.setLatency(0);
      proxy.heal();
      redis.disconnect();
      await proxy.close();
      await server.stop();
    },
  };
}
