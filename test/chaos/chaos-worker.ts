/**
 * One worker process of the chaos suite: the sample app (its AppModule, with the lock module on a
 * client that reaches Redis through this worker's fault proxy), driven by concurrent loops that
 * take a few hot keys through `LockService.using()` and through the sample's `@WithLock` purchase
 * route. Inside each critical section it records enter/exit with the fence and writes to a
 * fence-guarded resource on a separate, healthy Redis (standing in for a database that checks
 * fences). Events go to stdout as JSON lines; SIGTERM stops it gracefully.
 *
 * Usage: node chaos-worker.js '<WorkerConfig as JSON>'
 */
import 'reflect-metadata';
import { Injectable, Logger, type INestApplication, type LoggerService } from '@nestjs/common';
import { Test } from '@nestjs/testing';
import { Cluster, Redis } from 'ioredis';
import {
  getCurrentLock,
  LockService,
  REDIS_LOCK_MODULE_OPTIONS,
  type Lock,
  type RedisLockModuleOptions,
} from '../../lib/index.js';
import { AppModule } from '../../sample/app.module.js';
import { InventoryService, type PurchaseResult } from '../../sample/inventory/inventory.service.js';
import { LowStockMonitor } from '../../sample/jobs/low-stock.monitor.js';
import { SampleConfig } from '../../sample/sample.config.js';
import {
  GUARD_SCRIPT,
  LEADER_KEY,
  stallRecorder,
  type ChaosEvent,
  type SectionShape,
  type WorkerConfig,
} from './chaos-protocol.js';

const config = JSON.parse(process.argv[2]) as WorkerConfig;
const now = (): number => Number(process.hrtime.bigint()) / 1e6;
const emit = (event: ChaosEvent): void => void process.stdout.write(`${JSON.stringify(event)}\n`);

let unhandled = 0;
process.on('unhandledRejection', (reason) => {
  unhandled++;
  emit({
    t: 'unhandled',
    error: reason instanceof Error ? (reason.stack ?? String(reason)) : String(reason),
  });
});

// The fence-guarded resource. Never faulted: it is the database the lock protects.
const db = new Redis(config.dbPort, '127.0.0.1');
db.defineCommand('guardedWrite', { numberOfKeys: 2, lua: GUARD_SCRIPT });
const guardedWrite = (key: string, fence: number): Promise<number> =>
  (
    db as unknown as { guardedWrite(k: string, l: string, f: string): Promise<number> }
  ).guardedWrite(`resource:${key}`, `resource:${key}:accepted`, String(fence));

let sequence = 0;

/** How long after its `expiresAt` (on the `performance.now()` clock) a lock is used, if it is. */
function overdue(lock: Lock): number | undefined {
  const late = performance.now() - lock.expiresAt;
  return late > 0 ? late : undefined;
}
/** The critical section, the same for both paths. Throws the lock's LockLostError if it aborts. */
async function section(
  lock: Lock,
  path: 'using' | 'route',
  calledAt?: number,
  short = false,
  /**
   * Given, at the exit, what stops reporting a signal that comes after the section (at its hold's
   * release): a leader's sections run one after another on one lock, and a signal after the next
   * one began is that one's.
   */
  exited?: (stopListening: () => void) => void,
  /** A semaphore place or a read lock writes nothing (others hold the key with it); a write lock does. */
  shape?: SectionShape,
  /** One key of a lock on several keys (see the checker's `Section.multi`). */
  multi?: boolean,
): Promise<void> {
  const id = `${config.slot}.${process.pid}.${sequence++}`;
  const enter = now();
  emit({
    t: 'enter',
    id,
    key: lock.key,
    fence: lock.fence,
    path,
    at: enter,
    waited: calledAt === undefined ? undefined : enter - calledAt,
    hold: lock.token.slice(0, 16),
    overdue: overdue(lock),
    shape,
    multi,
  });
  let abortAt: number | undefined = lock.signal.aborted ? enter : undefined;
  /** The lease's end at the abort, on this clock (`expiresAt` is on `performance.now()`'s). */
  const leaseEnd = (): number => now() - (performance.now() - lock.expiresAt);
  let done = false;
  // Kept after the section: a signal that comes later (at the release) is reported on its own.
  // How long the event loop stood still while the lease ran (from a TTL before the section):
  // a lease lost to its own process's stall, not to a fault, is counted as starved.
  const worstTick = (at: number): number => stalls.worst(enter - config.ttl, at);
  const onAbort = (): void => {
    const at = now();
    if (done) emit({ t: 'signal', id, at, worstTick: worstTick(at), leaseEnd: leaseEnd() });
    else abortAt ??= at;
  };
  lock.signal.addEventListener('abort', onAbort, { once: true });
  let wrote: 'accepted' | 'rejected' | 'skipped' = 'skipped';
  try {
    const long = !short && Math.random() < config.longWorkRatio;
    const [min, max] = long ? config.longWorkMs : config.workMs;
    await sleep(min + Math.random() * (max - min), lock.signal);
    // A careful worker checks its lock before writing; the fence stops it when that is too late.
    lock.signal.throwIfAborted();
    if (shape === undefined || shape === 'write') {
      wrote = (await guardedWrite(lock.key, lock.fence)) === 1 ? 'accepted' : 'rejected';
    }
  } finally {
    done = true;
    exited?.(() => lock.signal.removeEventListener('abort', onAbort));
    const reason =
      abortAt === undefined ? undefined : (lock.signal.reason as { reason?: string }).reason;
    emit({
      t: 'exit',
      id,
      at: now(),
      abortAt,
      leaseEnd: abortAt === undefined ? undefined : leaseEnd(),
      reason,
      wrote,
      worstTick: abortAt === undefined ? undefined : worstTick(abortAt),
    });
  }
}

/** The sample's inventory, with its read-modify-write replaced by the recorded section. */
@Injectable()
class ChaosInventory extends InventoryService {
  override async sell(sku: string, quantity: number): Promise<PurchaseResult> {
    const lock = getCurrentLock(`sku:${sku}`)!;
    await section(lock, 'route');
    return { sku, quantity, remaining: 0, fence: lock.fence };
  }
}

/** Counts what the library logs; the chaos report shows it. */
class CountingLogger implements LoggerService {
  readonly counts = { warn: 0, error: 0 };
  /** The last error logged, with its stack: what a failed route call is reported with. */
  lastError = '';
  log(): void {}
  warn(): void {
    this.counts.warn++;
  }
  error(message: unknown, ...rest: unknown[]): void {
    this.counts.error++;
    this.lastError = [message, ...rest].map(String).join(' | ').slice(0, 1500);
  }
}

/** A failed call's error for the report: name, message, cause and the first frames. */
function describeError(error: unknown): string {
  if (!(error instanceof Error)) return String(error);
  const cause =
    error.cause instanceof Error ? ` (cause: ${error.cause.name}: ${error.cause.message})` : '';
  const frames = (error.stack ?? '').split('\n').slice(1, 6).join('\n');
  return `${error.name}: ${error.message}${cause}\n${frames}`;
}

/** The sample's lock options (prefix, per-environment timing) on another deployment. */
const sampleLockOptions = (
  deployment: Pick<RedisLockModuleOptions, 'client' | 'connection' | 'nodes'>,
): RedisLockModuleOptions => ({
  ...deployment,
  keyPrefix: 'sample:lock:',
  defaults: { ttl: config.ttl, acquireTimeout: config.acquireTimeout },
});

const target = config.lock;
/** Where the sample keeps its own data: the lock Redis when there is one, else the healthy one. */
const sampleRedisUrl =
  target.mode === 'standalone'
    ? target.url
    : target.mode === 'redlock'
      ? target.urls[0]
      : `redis://127.0.0.1:${config.dbPort}`;
/** A Cluster client is the app's own: the worker closes it after the app. */
let cluster: Cluster | undefined;
let builder = Test.createTestingModule({ imports: [AppModule] })
  .overrideProvider(SampleConfig)
  .useValue(
    new SampleConfig({
      redisUrl: sampleRedisUrl,
      reports: false,
      paymentDelay: 0,
      lockTtl: config.ttl,
      lockWait: config.acquireTimeout,
    }),
  );
if (target.mode !== 'standalone') {
  let deployment: Pick<RedisLockModuleOptions, 'client' | 'connection' | 'nodes'>;
  if (target.mode === 'redlock') deployment = { nodes: target.urls };
  else if (target.mode === 'sentinel') {
    const { sentinels, name, natMap } = target;
    deployment = { connection: { sentinels, name, natMap } };
  } else {
    cluster = new Cluster(target.startupNodes, { natMap: target.natMap });
    cluster.on('error', () => {}); // ioredis reports each failed slot refresh; the lock reports its own
    deployment = { client: cluster };
  }
  builder = builder
    .overrideProvider(REDIS_LOCK_MODULE_OPTIONS)
    .useValue(sampleLockOptions(deployment));
}
// Without the sample's leader worker: the checker counts every key left in Redis as a lock some
// holder failed to release, and a killed worker's leader key outlives the scenario's TTL.
const module = await builder
  .overrideProvider(InventoryService)
  .useClass(ChaosInventory)
  .overrideProvider(LowStockMonitor)
  .useValue({})
  .compile();
const app: INestApplication = module.createNestApplication({ logger: false });
await app.listen(0, '127.0.0.1');
const url = (await app.getUrl()).replace('[::1]', '127.0.0.1');
const logger = new CountingLogger();
Logger.overrideLogger(logger);
const locks = app.get(LockService);

// Calls spanning a freeze of this process are excused from the bound, and a failure during one
// is counted as starved.
const stalls = stallRecorder();

let stopping = false;
process.once('SIGTERM', () => void (stopping = true));

/**
 * One call on the using() path, in one of several shapes: a semaphore place (limit 2 or 3 on one
 * key, so that callers with different limits meet in one process and across processes), a read or
 * write lock (7 reads to 3 writes), or, on the key the route locks too, a section in the hold
 * itself, in a view of it (a nested `using()`), in two nested calls forked side by side (they take
 * turns, sharing the hold's fence), or in two keys held together (a section on each, at once). Its
 * TTL is the profile's or half of it: holders with different TTLs meet on every key.
 */
async function callUsing(key: string, calledAt: number): Promise<CallOutcome> {
  const options = {
    ttl: Math.random() < 0.5 ? config.ttl : config.ttl / 2,
    acquireTimeout: config.acquireTimeout,
  };
  const skuKey = `sku:${key}`;
  const shape = Math.random();
  try {
    if (Math.random() < config.shapeRatio) {
      if (Math.random() < 0.5) {
        const limit = Math.random() < 0.5 ? 2 : 3;
        await locks.using(
          `sem:${key}`,
          (lock) => section(lock, 'using', calledAt, false, undefined, { limit }),
          { ...options, limit },
        );
      } else {
        const mode = Math.random() < 0.7 ? 'read' : 'write';
        await locks.using(
          `rw:${key}`,
          (lock) => section(lock, 'using', calledAt, false, undefined, mode),
          { ...options, mode },
        );
      }
    } else if (shape < 0.55) {
      await locks.using(skuKey, (lock) => section(lock, 'using', calledAt), options);
    } else if (shape < 0.7) {
      await locks.using(
        skuKey,
        () => locks.using(skuKey, (view) => section(view, 'using', calledAt)),
        options,
      );
    } else if (shape < 0.85) {
      const forked = (): Promise<void> =>
        locks.using(skuKey, (view) => section(view, 'using', calledAt, true));
      await locks.using(skuKey, () => Promise.all([forked(), forked()]), options);
    } else {
      const other = config.keys[(config.keys.indexOf(key) + 1) % config.keys.length];
      const both = [skuKey, `sku:${other}`];
      await locks.using(
        both,
        () =>
          Promise.all(
            both.map((each) =>
              section(getCurrentLock(each)!, 'using', calledAt, false, undefined, undefined, true),
            ),
          ),
        options,
      );
    }
    return { outcome: 'ok' };
  } catch (error) {
    return { outcome: (error as Error).name ?? 'unknown', detail: describeError(error) };
  }
}

interface CallOutcome {
  outcome: string;
  detail?: string;
}

async function callRoute(key: string): Promise<CallOutcome> {
  try {
    const response = await fetch(`${url}/products/${key}/purchase`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: '{"quantity":1}',
    });
    await response.arrayBuffer();
    if (response.status === 201) return { outcome: 'ok' };
    const outcome = `http ${response.status}`;
    return response.status >= 500 ? { outcome, detail: logger.lastError } : { outcome };
  } catch (error) {
    return { outcome: `fetch ${(error as Error).name}`, detail: describeError(error) };
  }
}

async function loop(): Promise<void> {
  while (!stopping) {
    const key = config.keys[Math.floor(Math.random() * config.keys.length)];
    const path = Math.random() < config.routeRatio ? 'route' : 'using';
    const start = now();
    const pending = path === 'route' ? callRoute(key) : callUsing(key, start);
    let late = false;
    const watchdog = setTimeout(() => (late = true), config.callBoundMs);
    const { outcome, detail } = await pending;
    clearTimeout(watchdog);
    const end = now();
    const stalled = stalls.overlap(start, end);
    emit({
      t: 'call',
      path,
      outcome,
      start,
      ms: end - start,
      unsettled: late && !stalled,
      stalled,
      worstTick: stalls.worst(start, end),
      detail:
        detail &&
        `${detail}\n    (worker's event loop: longest tick ${stalls.worst(start, end).toFixed(0)} ms)`,
    });
    await sleep(Math.random() * config.thinkMs);
  }
}

emit({ t: 'ready', pid: process.pid, slot: config.slot });
// The runner says go once every worker has booted: calls made while the others boot (four Nest
// apps on two cores) would count in the first phase, the control, with a load no phase has.
await new Promise<void>((resolve) => process.stdin.once('data', () => resolve()));
process.stdin.destroy();

// Every worker campaigns for one leader key: its terms run sections back to back
// (the term's lock is the call chain's), until the term ends or the worker stops.
locks.lead(
  LEADER_KEY,
  async (term) => {
    const lock = getCurrentLock(LEADER_KEY)!;
    let previous: (() => void) | undefined;
    while (!term.signal.aborted && !stopping) {
      previous?.();
      await section(lock, 'using', undefined, false, (stop) => (previous = stop)).catch(() => {
        // The lock was lost: the term's signal has aborted with it.
      });
    }
  },
  { ttl: config.ttl },
);

await Promise.all(Array.from({ length: config.loops }, loop));
stalls.stop();
const closeStart = now();
await app.close();
const shutdownMs = now() - closeStart;
cluster?.disconnect();
db.disconnect();
emit({ t: 'summary', unhandled, shutdownMs, pauses: stalls.count(), logs: logger.counts });
process.exitCode = 0;

function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) return reject(signal.reason as Error);
    const onAbort = (): void => {
      clearTimeout(timer);
      reject(signal!.reason as Error);
    };
    const timer = setTimeout(() => {
      signal?.removeEventListener('abort', onAbort);
      resolve();
    }, ms);
    signal?.addEventListener('abort', onAbort, { once: true });
  });
}
