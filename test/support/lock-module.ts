import assert from 'node:assert/strict';
import {
  Logger,
  type DynamicModule,
  type INestApplication,
  type LoggerService,
  type Provider,
  type Type,
} from '@nestjs/common';
import { Test, type TestingModule } from '@nestjs/testing';
import { Redis } from 'ioredis';
import { randomUUID } from 'node:crypto';
import { after, before } from 'node:test';
import {
  LockService,
  RedisLockModule,
  type AcquireOptions,
  type Lock,
  type RedisLockModuleOptions,
} from '../../lib/index.js';
import { startRedis, type RedisServer } from './redis-server.js';

export interface LockModuleFixture {
  readonly module: TestingModule;
  readonly locks: LockService;
  close(): Promise<void>;
}

/**
 * Boots a Nest testing module with RedisLockModule.forRoot(options) (or the lock module given)
 * (and `providers`, if given) and returns its LockService.
 */
export async function startLockModule(
  options: RedisLockModuleOptions | DynamicModule,
  providers: Provider[] = [],
): Promise<LockModuleFixture> {
  const lockModule = 'module' in options ? options : RedisLockModule.forRoot(options);
  // (Without a logger of its own, compile() puts Nest's TestingLogger in place of the one a test
  // installed: see `LogCapture.install`.)
  const module = await Test.createTestingModule({
    imports: [lockModule],
    providers,
  })
    .setLogger(activeLogger)
    .compile();
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
  return `${name}-${randomUUID().slice(0, 8)}`;
}

export const sleep = (ms: number): Promise<void> =>
  new Promise((resolve) => setTimeout(resolve, ms));

/**
 * Awaits one step of a test's set-up, failing with a message that names it if it has not settled
 * within `ms`: a set-up that hangs says which step it hung in, instead of leaving the file's timeout
 * to cancel every test after it.
 */
export async function setUpStep<T>(what: string, promise: Promise<T>, ms = 60_000): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const deadline = new Promise<never>((_, reject) => {
    timer = setTimeout(
      () => reject(new Error(`set-up: ${what} did not finish within ${ms / 1_000} s`)),
      ms,
    );
  });
  try {
    return await Promise.race([promise, deadline]);
  } finally {
    clearTimeout(timer);
  }
}

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

/** An HTTP app on a free loopback port (see `startHttpApp`). */
export interface HttpAppFixture {
  readonly app: INestApplication;
  readonly locks: LockService;
  /** `http://127.0.0.1:<port>` */
  readonly url: string;
}

/**
 * Boots an HTTP app (Express) with RedisLockModule.forRoot(options), `controllers` and
 * `providers`, logging to `logger`, listening on a free 127.0.0.1 port. Close it with `app.close()`.
 */
export async function startHttpApp(
  options: RedisLockModuleOptions,
  { controllers = [], providers = [] }: { controllers?: Type[]; providers?: Provider[] },
  logger: LoggerService,
): Promise<HttpAppFixture> {
  const module = await Test.createTestingModule({
    imports: [RedisLockModule.forRoot(options)],
    controllers,
    providers,
  }).compile();
  const app = module.createNestApplication({ logger });
  await app.listen(0, '127.0.0.1');
  const url = (await app.getUrl()).replace('[::1]', '127.0.0.1');
  return { app, locks: app.get(LockService), url };
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

  /**
   * Routes Nest's static Logger here until the returned function is called, also across the lock
   * modules `startLockModule` starts meanwhile.
   */
  static install(): { capture: LogCapture; restore: () => void } {
    const capture = new LogCapture();
    activeLogger = capture;
    Logger.overrideLogger(capture);
    return {
      capture,
      restore: () => {
        activeLogger = silent;
        Logger.overrideLogger(silent);
      },
    };
  }
}

/** Keeps test output readable: the library's warnings are asserted through LogCapture where they matter. */
class SilentLogger implements LoggerService {
  log(): void {}
  error(): void {}
  warn(): void {}
}
const silent = new SilentLogger();
/** What the lock modules tests start log to (see `LogCapture.install`). */
let activeLogger: LoggerService = silent;
Logger.overrideLogger(silent);

/**
 * With a caller's own token that holds the key as `options` (a semaphore's place, a read lock),
 * acquiring again returns the same fence, also after another holder's later fence and an
 * extension; once given back, the token's next hold is a new holder with a greater fence; nothing
 * is left in Redis afterwards.
 */
export async function assertOwnTokenKeepsFence(
  env: TwoApps,
  options: AcquireOptions,
): Promise<void> {
  const key = uniqueKey('own');
  const mine = await env.locks.acquire(key, { ...options, token: 'mine', ttl: 10_000 });
  const theirs = await env.other.locks.acquire(key, options); // a later, greater fence
  assert.ok(theirs.fence > mine.fence);
  const again = await env.locks.acquire(key, { ...options, token: 'mine', ttl: 10_000 });
  assert.equal(again.fence, mine.fence, 'the same fence for the token that holds it');
  await again.extend(20_000);
  assert.equal((await env.locks.acquire(key, { ...options, token: 'mine' })).fence, mine.fence);
  assert.equal(await mine.release(), true);
  const next = await env.locks.acquire(key, { ...options, token: 'mine' });
  assert.ok(next.fence > theirs.fence, `${next.fence} after ${theirs.fence}`);
  await next.release();
  await theirs.release();
  assert.deepEqual(await env.redis.keys(`lock:{${key}}*`), []);
}

/**
 * A lock on `key` held through `locks` (TTL 30 s), with a caller of the same app queued behind it
 * (its heir), for tests where Redis forgets the lock behind the holder's back. Once another app
 * holds the key (`intruder`), `assertHeirAfter` releases it 200 ms later and checks that the heir
 * was not granted the key while the intruder held it (passed on in the process, it would have
 * started at once with the next fence of the holder's block, below the intruder's), and that if it
 * got the key (`mustGet`: it must), its fence is above the intruder's.
 */
export async function heldWithHeir(
  locks: LockService,
  key: string,
  /** A client of the same Redis, to see the heir's process queued (`P{K}:turns`). */
  redis: Pick<Redis, 'exists'>,
): Promise<{ held: Lock; assertHeirAfter(intruder: Lock, mustGet: boolean): Promise<void> }> {
  const held = await locks.acquire(key, { ttl: 30_000 });
  const settled = locks.acquire(key, { ttl: 30_000, acquireTimeout: 10_000 }).then(
    (lock) => ({ lock, at: performance.now() }),
    (error: unknown) => ({ error, at: performance.now() }),
  );
  // Its attempt found the key held; then it subscribes and tries once more, and sleeps.
  assert.ok(await eventually(async () => (await redis.exists(`lock:{${key}}:turns`)) === 1));
  await sleep(150);
  return {
    held,
    async assertHeirAfter(intruder, mustGet) {
      await sleep(200);
      const intruderHeldUntil = performance.now();
      await intruder.release();
      const outcome = await settled;
      if (!('lock' in outcome)) {
        if (mustGet) throw new Error('the heir never got the key', { cause: outcome.error });
        return;
      }
      const { lock, at } = outcome;
      assert.ok(
        at > intruderHeldUntil,
        `the heir was granted while another app held the key (fence ${lock.fence} beside ${intruder.fence})`,
      );
      assert.ok(lock.fence > intruder.fence, `${lock.fence} after ${intruder.fence}`);
      await lock.release();
    },
  };
}

/**
 * How many callers of `locks` wait for `key` (for any key without one), as `maxWaiters` counts
 * them (internal: issue 40's `inspect()` will say): what a test waits for instead of sleeping.
 */
export function waitingCallers(locks: LockService, key?: string): number {
  const { waiters } = (
    locks as unknown as {
      engine: { parts: { waiters: { total: number; perKey: Map<string, number> } } };
    }
  ).engine.parts;
  return key === undefined ? waiters.total : (waiters.perKey.get(key) ?? 0);
}
