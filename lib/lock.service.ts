import {
  Inject,
  Injectable,
  Logger,
  type OnApplicationBootstrap,
  type OnApplicationShutdown,
  type OnModuleDestroy,
} from '@nestjs/common';
import type { Observable } from 'rxjs';
import { LockEngine, type Keys } from './engine/lock.engine.js';
import type { BackendHealth } from './interfaces/lock-backend.interface.js';
import type {
  AcquireOptions,
  ForcedRelease,
  Lock,
  LockInspection,
} from './interfaces/lock.interface.js';
import type { LockEvent } from './interfaces/lock-event.interface.js';
import type { RedisLockModuleOptions } from './interfaces/redis-lock-options.interface.js';
import type { LockTimeoutResponse } from './interfaces/with-lock-options.interface.js';
import {
  assertLeadArguments,
  Leaderships,
  type LeaderInfo,
  type LeaderTerm,
  type Leadership,
  type LeadOptions,
} from './lock.leadership.js';
import { MODULE_OPTIONS_TOKEN } from './redis-lock.module-definition.js';
import { LockArgumentError, type KeyView } from './errors/redis-lock.errors.js';
import { assertKey } from './options/checks.js';
import { forceReleaseOptionsProblem, resolveAcquireOptions } from './options/acquire-options.js';
import { resolveModuleOptions } from './options/module-options.js';
import { type ResolvedDefaults } from './options/defaults.js';

/**
 * Takes, watches and releases distributed locks: the API and its Nest lifecycle. Every public
 * method, `@WithLock` and `lead()` included, goes through one engine (`LockEngine`): the same
 * acquire loop and the same lease.
 */
@Injectable()
export class LockService implements OnApplicationBootstrap, OnModuleDestroy, OnApplicationShutdown {
  protected readonly logger = new Logger('RedisLock');
  private readonly engine: LockEngine;
  private readonly defaults: ResolvedDefaults;
  private readonly leaderships: Leaderships;
  /** Shutdown's first step, once begun (see `onModuleDestroy`). */
  private leadersStopped: Promise<void> | undefined;
  /** @internal How `@WithLock` handlers answer a lock timeout, as set on the module. */
  readonly timeoutResponse: LockTimeoutResponse;
  /**
   * Every lock taken, released, extended, lost or timed out through this service (and its
   * `@WithLock` methods), for metrics and logs. Never carries a token. Costs nothing while nobody
   * subscribes; completes on shutdown.
   * @example
   * locks.events.pipe(filter((e) => e.type === 'lost')).subscribe((e) => alert(e.key, e.reason));
   */
  readonly events: Observable<LockEvent>;

  constructor(@Inject(MODULE_OPTIONS_TOKEN) options: RedisLockModuleOptions) {
    const resolved = resolveModuleOptions(options);
    this.defaults = resolved.defaults;
    this.timeoutResponse = resolved.timeoutResponse;
    this.engine = new LockEngine(resolved, this.logger);
    this.events = this.engine.events.observable;
    this.leaderships = new Leaderships(
      {
        run: (key, term, acquire) => this.engine.using(key, term, acquire),
        undone: (key) => this.engine.undone(key),
        probe: (key) => this.engine.isLocked(key),
        recordTerm: (lock, id, ttl) => this.engine.recordTerm(lock, id, ttl),
        participate: (key, entry, stay) => this.engine.participate(key, entry, stay),
        leader: (key) => this.leader(key),
      },
      this.logger,
      this.defaults.keyView,
      this.engine.events,
    );
  }

  /**
   * Takes the lock on `key`, waiting up to `acquireTimeout` while someone else holds it.
   * Release it with `lock.release()` in a `finally` block, or prefer `using()`.
   * Auto-extension is off unless asked for: a forgotten handle still expires after `ttl`.
   *
   * An array of keys locks them all or none: one after another in one order that every caller
   * uses (sorted), so two callers that name the same keys in different orders never deadlock;
   * if one stays taken for `acquireTimeout`, those already taken are released.
   * @throws LockAcquireTimeoutError when the lock stayed taken for `acquireTimeout`
   * @throws LockAcquireAbortedError when `signal` aborts the wait
   * @example
   * const lock = await locks.acquire(`order:${id}`, { ttl: 5_000 });
   * try { await pay(id, lock.fence); } finally { await lock.release(); }
   * @example
   * const both = await locks.acquire([`acct:${from}`, `acct:${to}`]);
   */
  acquire(key: Keys, options?: AcquireOptions): Promise<Lock> {
    return this.engine.acquire(key, options, 'acquire') as Promise<Lock>;
  }

  /**
   * Makes one attempt at the lock on `key` (or on every key of an array) and never waits.
   * @returns the lock, or `null` if someone else holds it (any of the keys: then none is kept)
   */
  tryAcquire(key: Keys, options?: AcquireOptions): Promise<Lock | null> {
    return this.engine.acquire(key, options, 'tryAcquire');
  }

  /**
   * Runs `fn` while holding the lock on `key` and releases it afterwards, whatever `fn` does.
   * Returns what `fn` returns and rethrows what it throws, unchanged: a failed release is logged,
   * never thrown over the result. The lock is auto-extended while `fn` runs (turn off with
   * `autoExtend: false`); watch `lock.signal` to stop work if the lock is lost. Nested calls on
   * the same key in the same async call chain re-enter the lock instead of deadlocking. An array
   * of keys locks them all, as `acquire()` does.
   * @example
   * await locks.using(`sku:${sku}`, async (lock) => reserve(sku, qty, lock.signal));
   * @example
   * await locks.using([`acct:${from}`, `acct:${to}`], (lock) => transfer(from, to, lock.fences));
   */
  using<T>(key: Keys, fn: (lock: Lock) => T | Promise<T>, options?: AcquireOptions): Promise<T> {
    return this.engine.using(key, fn, options);
  }

  /** Releases `lock`. Resolves `false` if it was no longer ours (expired, taken over, already released). */
  async release(lock: Lock): Promise<boolean> {
    return this.engine.release(lock);
  }

  /**
   * Resets the TTL of `lock` to `ttl` (default: the TTL it last had).
   * @throws LockLostError if it is no longer ours
   */
  async extend(lock: Lock, ttl?: number): Promise<void> {
    return this.engine.extend(lock, ttl);
  }

  /** Whether anyone holds the lock on `key` right now. Only a hint: it may change at once. */
  async isLocked(key: string): Promise<boolean> {
    assertKey(key, this.defaults);
    return this.engine.isLocked(key);
  }

  /**
   * What holds the lock on `key` now, for an operator: whether it is held, by what shape and how
   * many, for how long yet, the fence where Redis records it, and who waits where Redis knows it
   * (see `LockInspection`). On every deployment; in Redlock mode, what a majority of nodes holds.
   * @throws LockBackendError when Redis does not answer within `commandTimeout`
   */
  async inspect(key: string): Promise<LockInspection> {
    assertKey(key, this.defaults);
    const { mode, holders, ttlLeft, fence, waiting } = await this.engine.inspect(key);
    return { held: mode !== null, mode, holders, ttlLeft, fence, waiting };
  }

  /**
   * Frees the lock on `key` whatever holds it (a plain, fair or write lock, a semaphore's places,
   * read locks), for an operator with a lock stuck behind a holder that hangs: deletes it in Redis,
   * wakes its waiters, logs a warning naming `reason` and emits a `forced` event. The library
   * never calls it. A holder is not told by Redis: it learns at its next extension (with
   * auto-extension, within a third of its TTL) or when its lease runs out, and its `signal` aborts
   * then (in this process, at once); until then it may still be working, so protect what it
   * writes with its fence. Resolves with what was freed (`holders: 0`: nothing held the key).
   * @throws LockArgumentError for a bad key or a missing `reason`
   * @throws LockBackendError when Redis does not answer within `commandTimeout` (in Redlock mode,
   * `LockQuorumError` when fewer than a majority of nodes answer: the holder may keep the lock)
   * @example
   * await locks.forceRelease('report:daily', { reason: 'worker 7 hung, ticket OPS-1234' });
   */
  async forceRelease(key: string, options: { reason: string }): Promise<ForcedRelease> {
    assertKey(key, this.defaults);
    const problem = forceReleaseOptionsProblem(options);
    if (problem) throw new LockArgumentError(...problem);
    return this.engine.forceRelease(key, options.reason);
  }

  /**
   * Who leads the leadership of `key` (see `lead()`), from any instance, campaigning or not: the
   * leader's id, its term's fence, since when it leads and when its lease was last extended
   * (Redis's clock), and how many terms began; `null` while nobody leads. Only a hint: it may
   * change at once (the leader's own term `signal` is what tells it).
   * @throws LockBackendError when Redis does not answer within `commandTimeout`
   */
  async leader(key: string): Promise<LeaderInfo | null> {
    assertKey(key, this.defaults);
    const { leader, transitions } = await this.engine.election(key, false);
    if (!leader) return null;
    const { id, fence, since, renewedAt } = leader;
    return { id, fence, since: new Date(since), renewedAt: new Date(renewedAt), transitions };
  }

  /**
   * The ids of the participants campaigning for the leadership of `key` now, in every instance
   * (sorted): each campaign renews its place every third of its TTL and leaves when it stops, so
   * one that died drops out within its TTL.
   * @throws LockBackendError when Redis does not answer within `commandTimeout`
   */
  async participants(key: string): Promise<string[]> {
    assertKey(key, this.defaults);
    return (await this.engine.election(key, true)).participants;
  }

  /**
   * Campaigns for leadership of `key` until `stop()` or shutdown: whenever this instance holds the
   * key, `work(term)` runs with the term's fence (greater than every earlier leader's) and a
   * `signal` that aborts the moment leadership is lost or may be; when `work` settles or the
   * lock is lost, the lock is released and the campaign goes on (after the module's
   * `retryInterval`, so that others get their turn). A `work` that throws is logged. At most one
   * instance leads at a time while the lock holds (the fence stops a leader that lost it without
   * knowing). A campaign waits as any waiter of the lock does: woken by the release message.
   * @throws LockArgumentError (synchronously) for a bad key, `work` or option
   * @throws RedisLockShutdownError (synchronously) once the module is shutting down
   * @example
   * const leadership = locks.lead('leader:ingest', async ({ fence, signal }) => {
   *   while (!signal.aborted) await ingestBatch({ fence, signal });
   * });
   * await leadership.stop();
   */
  lead(key: string, work: (term: LeaderTerm) => unknown, options?: LeadOptions): Leadership {
    assertLeadArguments(work, options);
    const { id, ...lockOptions } = options ?? {};
    const { ttl } = resolveAcquireOptions(key, lockOptions, this.defaults, 'using');
    this.engine.assertRunning(key);
    return this.leaderships.start(key, work, ttl, this.defaults.retryInterval, id);
  }

  /**
   * The leadership this service campaigns for on `key`, started by `lead()` or for a
   * `@WhileLeader` method (the first, if several), or `undefined` if none runs (never started,
   * or stopped).
   * @throws LockArgumentError for a bad key
   * @example
   * const leading = locks.leadership('leader:ingest')?.isLeader ?? false;
   */
  leadership(key: string): Leadership | undefined {
    assertKey(key, this.defaults);
    return this.leaderships.find(key);
  }

  /**
   * Startup, within `commandTimeout`: on a Cluster, asks the servers how releases are announced
   * (and logs it; never fails the bootstrap); in Redlock mode, checks that no two nodes are one
   * server (`RedisLockConfigurationError` if they are; the service closes its connections first,
   * so that a failed startup leaves nothing open, whatever the Nest version does on `close()`).
   */
  onApplicationBootstrap(): Promise<void> {
    return this.engine.prepare();
  }

  /** @internal Until its shutdown begins. */
  get running(): boolean {
    return this.engine.running;
  }

  /** @internal The module's `maxKeyLength`, which `@WithLock` checks its keys against. */
  get maxKeyLength(): number {
    return this.defaults.maxKeyLength;
  }

  /** @internal How the module shows keys in log lines and messages (its `logKeys`). */
  get keyView(): KeyView {
    return this.defaults.keyView;
  }

  /** @internal The TTL of a lock whose call gives none (`defaults.ttl`). */
  get defaultTtl(): number {
    return this.defaults.ttl;
  }

  /**
   * @internal For `RedisLockHealthIndicator`: whether Redis answers a PING (in Redlock mode, a
   * majority of nodes), within `commandTimeout`, with the leaderships campaigning now in its
   * details (`leaderships`: key, id, state). Never rejects.
   */
  async checkHealth(): Promise<BackendHealth> {
    const health = await this.engine.health();
    const leaderships = this.leaderships.report();
    if (leaderships.length === 0) return health;
    return { ...health, details: { ...health.details, leaderships } };
  }

  /**
   * Shutdown, first step: every leadership still running is stopped, its term's `signal` aborted
   * and its work waited for, up to the longest leader TTL; its lock's release goes out at once, so
   * the next leader starts, within the engine's one shutdown deadline. A work that ignores its
   * signal longer is logged, and its lock is released with the others at `onApplicationShutdown`.
   * The module runs this before the first `onModuleDestroy` of any provider of the app, so that
   * nothing a leader's work uses is torn down while it runs (see `RedisLockModule`); here again,
   * for an app none of whose providers has one.
   */
  onModuleDestroy(): Promise<void> {
    // Once: every hook it runs before waits for the same stop, never for the work again.
    return (this.leadersStopped ??= this.leaderships.stopAll());
  }

  /**
   * Shutdown: rejects pending acquisitions, stops watchdogs, releases every lock this service
   * holds (their signals abort with reason `shutdown`), waits for what is still on its way to
   * Redis (late grants' undos, releases, hand-overs) and closes the connections it created. One
   * deadline of twice `commandTimeout` whatever Redis does: then the connections are dropped;
   * releases that got no reply are logged and their locks expire after their TTL.
   */
  async onApplicationShutdown(): Promise<void> {
    // Leaderships started after onModuleDestroy: no new term, no pause left behind.
    this.leaderships.abortAll();
    await this.engine.shutdown();
  }
}
