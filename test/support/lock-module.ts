import { Logger, type LoggerService } from '@nestjs/common';
import { Test, type TestingModule } from '@nestjs/testing';
import { Redis } from 'ioredis';
import { randomUUID } from 'node:crypto';
import { after, before } from 'node:test';
import { LockService, RedisLockModule, type RedisLockModuleOptions } from '../../lib/index.js';
import { startRedis, type RedisServer } from './redis-server.js';

export interface LockModuleFixture {
  readonly module: TestingModule;
  readonly locks: LockService;
  close(): Promise<void>;
}

/** Boots a Nest testing module with RedisLockModule.forRoot(options) and returns its LockService. */
export async function startLockModule(options: RedisLockModuleOptions): Promise<LockModuleFixture> {
  const module = await Test.createTestingModule({
    imports: [RedisLockModule.forRoot(options)],
  }).compile();
  await module.init();
  return { module, locks: module.get(LockService), close: () => module.close() };
}

/**
 * An app whose waiters never poll within a test (`retryInterval` 60 s): when one of them gets a
 * lock held with a long TTL within its `acquireTimeout` (under 60 s), a release woke it. So a test
 * tells "woken by the release" from "found it free at a poll" without reading the clock.
 */
export function startNonPollingApp(options: RedisLockModuleOptions): Promise<LockModuleFixture> {
  return startLockModule({ ...options, defaults: { ...options.defaults, retryInterval: 60_000 } });
}

/** A private Redis with two instances of an app on it: see `twoAppsOnOneRedis`. */
export interface TwoApps {
  readonly server: RedisServer;
  /** The first app, and its LockService as `locks`. */
  readonly app: LockModuleFixture;
  readonly locks: LockService;
  /** A second app on the same Redis: another instance of the service. */
  readonly other: LockModuleFixture;
  /** A plain client of that Redis, to look at what the locks leave there. */
  readonly redis: Redis;
}

/**
 * Registers, in the calling `describe`, hooks that start a private redis-server and two lock
 * modules on it (`options` plus the connection) before its tests, and stop exactly those after
 * them. The returned object is filled in by the time the tests run.
 */
export function twoAppsOnOneRedis(options: Partial<RedisLockModuleOptions> = {}): TwoApps {
  const env = {} as { -readonly [K in keyof TwoApps]: TwoApps[K] };
  before(async () => {
    env.server = await startRedis();
    const moduleOptions = { ...options, connection: env.server.url } as RedisLockModuleOptions;
    env.app = await startLockModule(moduleOptions);
    env.other = await startLockModule(moduleOptions);
    env.locks = env.app.locks;
    env.redis = new Redis(env.server.port, '127.0.0.1');
  });
  after(async () => {
    await env.app?.close();
    await env.other?.close();
    env.redis?.disconnect();
    await env.server?.stop();
  });
  return env;
}

/** A key no other test uses. */
export function uniqueKey(name = 'key'): string {
  return `${name}:${randomUUID().slice(0, 8)}`;
}

export const sleep = (ms: number): Promise<void> =>
  new Promise((resolve) => setTimeout(resolve, ms));

/** Polls `condition` until it holds or `ms` pass; returns whether it held. */
export async function eventually(
  condition: () => boolean | Promise<boolean>,
  ms = 5_000,
): Promise<boolean> {
  const end = performance.now() + ms;
  while (performance.now() < end) {
    if (await condition()) return true;
    await sleep(10);
  }
  return condition();
}

/** Collects what the library logs through Nest's Logger while a test runs. */
export class LogCapture implements LoggerService {
  readonly lines: { level: string; message: string }[] = [];
  log(message: unknown): void {
    this.push('log', message);
  }
  error(message: unknown): void {
    this.push('error', message);
  }
  warn(message: unknown): void {
    this.push('warn', message);
  }
  debug(message: unknown): void {
    this.push('debug', message);
  }
  verbose(message: unknown): void {
    this.push('verbose', message);
  }
  fatal(message: unknown): void {
    this.push('fatal', message);
  }
  private push(level: string, message: unknown): void {
    this.lines.push({ level, message: String(message) });
  }

  /** Routes Nest's static Logger here until the returned function is called. */
  static install(): { capture: LogCapture; restore: () => void } {
    const capture = new LogCapture();
    Logger.overrideLogger(capture);
    return { capture, restore: () => Logger.overrideLogger(new SilentLogger()) };
  }
}

/** Keeps test output readable: the library's warnings are asserted through LogCapture where they matter. */
class SilentLogger implements LoggerService {
  log(): void {}
  error(): void {}
  warn(): void {}
}
Logger.overrideLogger(new SilentLogger());
