import {
  Inject,
  Injectable,
  Logger,
  type OnApplicationBootstrap,
  type OnApplicationShutdown,
  type OnModuleDestroy,
} from '@nestjs/common';
import type { Observable } from 'rxjs';
import { setMaxListeners } from 'node:events';
import {
  LockAcquireAbortedError,
  LockAcquireTimeoutError,
  LockArgumentError,
  LockBackendError,
  RedisLockShutdownError,
  type LockOperation,
} from './errors/redis-lock.errors.js';
import type {
  AcquireAttempt,
  BackendHealth,
  Handoff,
  LockBackend,
  PendingSwap,
  ReleaseSubscription,
} from './interfaces/lock-backend.interface.js';
import type { AcquireOptions, Lock } from './interfaces/lock.interface.js';
import type { RedisLockModuleOptions } from './interfaces/redis-lock-options.interface.js';
import type { LockTimeoutResponse } from './interfaces/with-lock-options.interface.js';
import type { LockEvent } from './interfaces/lock-event.interface.js';
import { findChainLock, runHoldingLock, type ChainLock } from './lock.context.js';
import { LockEvents } from './lock.events.js';
import { LockHandle, type LockOwnerHooks } from './lock.handle.js';
import {
  assertLeadArguments,
  Campaign,
  type LeaderTerm,
  type Leadership,
  type LeadOptions,
} from './lock.leadership.js';
import { assertReentry, LockReentry } from './lock.reentry.js';
import { MultiKeyLock, type KeyHold } from './multi-key-lock.handle.js';
import { MODULE_OPTIONS_TOKEN } from './redis-lock.module-definition.js';
import {
  assertKey,
  lockOrder,
  PLAIN,
  resolveAcquireOptions,
  resolveModuleOptions,
  type AcquireMode,
  type ResolvedAcquireOptions,
  type ResolvedDefaults,
} from './redis-lock.options.js';
import { createLockBackend } from './redis/lock-backend.factory.js';
import { freshToken } from './utils/token.js';
import { LinkedList } from './utils/linked-list.js';
import { ReplyDeadlines } from './utils/reply-deadlines.js';
import { DEADLINE, ignoreDeadline, within } from './utils/within.js';

/** What a caller that queues behind this process's waiters starts from: no attempt made yet. */
const QUEUED: AcquireAttempt = { acquired: false, retryAfter: undefined };

/** One key, or several to lock together (all or none). */
type Keys = string | readonly string[];

/**
 * Takes, watches and releases distributed locks. Every public method, `@WithLock` included,
 * goes through the same acquire loop (`obtain`) and the same lease (`LockHandle`).
 */
@Injectable()
export class LockService implements OnApplicationBootstrap, OnModuleDestroy, OnApplicationShutdown {
  protected readonly logger = new Logger('RedisLock');
  private readonly backend: LockBackend;
  private readonly defaults: ResolvedDefaults;
  private readonly commandTimeout: number;
  /** Bounds every Redis reply by `commandTimeout`. */
  private readonly deadlines: ReplyDeadlines;
  /**
   * Locks taken through this service and neither released nor lost: a `LinkedList`, which they
   * enter and leave without allocating.
   */
  private readonly held = new LinkedList<LockHandle>();
  /** Undos in flight (see `undoing()`). */
  private readonly undos = new Set<Promise<unknown>>();
  private readonly stopping = new AbortController();
  /** Leaderships campaigning (see `lead()`). */
  private readonly campaigns = new Set<Campaign>();
  private readonly hooks: LockOwnerHooks;
  private readonly stopWatchingReconnects: () => void;
  /** @internal How `@WithLock` handlers answer a lock timeout, as set on the module. */
  readonly timeoutResponse: LockTimeoutResponse;
  private readonly lockEvents = new LockEvents(this.logger);
  /**
   * Every lock taken, released, extended, lost or timed out through this service (and its
   * `@WithLock` methods), for metrics and logs. Never carries a token. Costs nothing while nobody
   * subscribes; completes on shutdown.
   * @example
   * locks.events.pipe(filter((e) => e.type === 'lost')).subscribe((e) => alert(e.key, e.reason));
   */
  readonly events: Observable<LockEvent> = this.lockEvents.observable;

  constructor(@Inject(MODULE_OPTIONS_TOKEN) options: RedisLockModuleOptions) {
    // Every waiter listens on this one signal (and removes its listener when done).
    setMaxListeners(0, this.stopping.signal);
    const resolved = resolveModuleOptions(options);
    this.defaults = resolved.defaults;
    this.commandTimeout = resolved.commandTimeout;
    this.timeoutResponse = resolved.timeoutResponse;
    this.backend = createLockBackend(resolved, this.logger);
    this.deadlines = new ReplyDeadlines(this.backend.replyTimeout);
    this.hooks = {
      backend: this.backend,
      logger: this.logger,
      events: this.lockEvents,
      reply: (key, operation, pending) => this.reply(key, operation, pending),
      settled: (lock) => this.held.remove(lock),
    };
    // Redis may have restarted empty or failed over while the connection was down: check every
    // held lock at once instead of waiting for its next extension (or none, without autoExtend).
    this.stopWatchingReconnects = this.backend.onReconnect(() => {
      for (const lock of this.held.toArray()) void lock.verify();
    });
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
    return this.obtainKeys(key, options, 'acquire') as Promise<Lock>;
  }

  /**
   * Makes one attempt at the lock on `key` (or on every key of an array) and never waits.
   * @returns the lock, or `null` if someone else holds it (any of the keys: then none is kept)
   */
  tryAcquire(key: Keys, options?: AcquireOptions): Promise<Lock | null> {
    return this.obtainKeys(key, options, 'tryAcquire');
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
  async using<T>(
    key: Keys,
    fn: (lock: Lock) => T | Promise<T>,
    options?: AcquireOptions,
  ): Promise<T> {
    if (typeof fn !== 'function') throw new LockArgumentError('fn', fn, 'must be a function');
    const lock = (await this.obtainKeys(key, options, 'using'))!;
    try {
      return await runHoldingLock(this, lock, () => fn(lock));
    } finally {
      await this.releaseQuietly(lock);
    }
  }

  /**
   * Campaigns for leadership of `key` until `stop()` or shutdown: whenever this instance holds the
   * key, `work(term)` runs with the term's fence (greater than every earlier leader's) and a
   * `signal` that aborts the moment leadership is lost or may be; when `work` settles or the
   * lock is lost, the lock is released and the campaign goes on (after the module's
   * `retryInterval`, so that others get their turn). A `work` that throws is logged. At most one
   * instance leads at a time while the lock holds (the fence stops a leader that lost it without
   * knowing). Waiting costs no polling: a campaign wakes on the lock's release messages.
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
    const { ttl } = resolveAcquireOptions(key, options, this.defaults, 'using');
    this.throwIfStopped(key, undefined);
    const campaign = new Campaign(
      key,
      work,
      ttl,
      this.defaults.retryInterval,
      (name, term, acquire) => this.using(name, term, acquire),
      this.logger,
    );
    this.campaigns.add(campaign);
    void campaign.done.then(() => this.campaigns.delete(campaign));
    return campaign;
  }

  /** Releases `lock`. Resolves `false` if it was no longer ours (expired, taken over, already released). */
  async release(lock: Lock): Promise<boolean> {
    return this.ownHandle(lock).release();
  }

  /**
   * Resets the TTL of `lock` to `ttl` (default: the TTL it last had).
   * @throws LockLostError if it is no longer ours
   */
  async extend(lock: Lock, ttl?: number): Promise<void> {
    return this.ownHandle(lock).extend(ttl);
  }

  /** Whether anyone holds the lock on `key` right now. Only a hint: it may change at once. */
  async isLocked(key: string): Promise<boolean> {
    assertKey(key);
    return this.reply(key, 'isLocked', this.backend.isLocked(key));
  }

  /**
   * Startup, within `commandTimeout`: on a Cluster, asks the servers how releases are announced
   * (and logs it; never fails the bootstrap); in Redlock mode, checks that no two nodes are one
   * server (`RedisLockConfigurationError` if they are; the service closes its connections first,
   * so that a failed startup leaves nothing open, whatever the Nest version does on `close()`).
   */
  async onApplicationBootstrap(): Promise<void> {
    try {
      await this.backend.prepare();
    } catch (error) {
      await this.onApplicationShutdown();
      throw error;
    }
  }

  /**
   * @internal For `RedisLockHealthIndicator`: whether Redis answers a PING (in Redlock mode, a
   * majority of nodes), within `commandTimeout`. Never rejects.
   */
  checkHealth(): Promise<BackendHealth> {
    return this.backend.health();
  }

  /**
   * Shutdown, first step: every leadership (`lead()`, `@WhileLeader`) is stopped, its term's
   * `signal` aborted and its work waited for, up to the longest leader TTL; then released, so the
   * next leader starts at once. A work that ignores its signal longer is logged, and its lock is
   * released with the others at `onApplicationShutdown`.
   */
  async onModuleDestroy(): Promise<void> {
    const campaigns = [...this.campaigns];
    if (campaigns.length === 0) return;
    const longest = Math.max(...campaigns.map((campaign) => campaign.ttl));
    await within(
      Promise.all(campaigns.map((campaign) => campaign.stop('shutdown'))),
      longest,
      [],
    ).catch((error: unknown) => {
      ignoreDeadline(error);
      for (const campaign of campaigns.filter(({ ended }) => !ended)) {
        this.logger.warn(
          `Leader work for "${campaign.key}" did not return within ${campaign.ttl} ms of its term's signal aborting on shutdown: its lock is released now, and another instance may lead while it still runs (its stale fence is what stops its writes)`,
        );
      }
    });
  }

  /**
   * Shutdown: rejects pending acquisitions, stops watchdogs, releases every lock this service
   * holds (their signals abort with reason `shutdown`) and closes the connections it created.
   * Bounded by twice `commandTimeout` whatever Redis does: releases that get no reply are logged
   * and their locks expire after their TTL.
   */
  async onApplicationShutdown(): Promise<void> {
    if (this.stopping.signal.aborted) return;
    this.stopping.abort(new RedisLockShutdownError('*'));
    // Leaderships started after onModuleDestroy: no new term, no pause left behind.
    for (const campaign of this.campaigns) void campaign.stop('shutdown');
    this.deadlines.interrupt(this.stopping.signal.reason as Error);
    this.stopWatchingReconnects();
    const locks = this.held.toArray();
    const [results] = await Promise.all([
      Promise.allSettled(locks.map((lock) => lock.abandon())),
      // The grants of attempts shutdown interrupted, undone before the connections close; no
      // longer than an attempt's reply and a release take.
      within(Promise.all(this.undos), 2 * this.commandTimeout, []).catch(ignoreDeadline),
    ]);
    results.forEach((result, i) => {
      if (result.status === 'rejected') {
        this.logger.warn(
          `Could not release lock "${locks[i].key}" (fence ${locks[i].fence}) on shutdown; it expires after its TTL: ${String(result.reason)}`,
        );
      }
    });
    await this.backend.close();
    this.lockEvents.complete();
  }

  /**
   * One key (straight to `obtain`: no extra promise on the hot path), or several (see
   * `obtainList`).
   */
  private obtainKeys(
    key: Keys,
    options: AcquireOptions | undefined,
    mode: AcquireMode,
  ): Promise<ChainLock | null> {
    return Array.isArray(key)
      ? this.obtainList(key as readonly string[], options, mode)
      : this.obtain(key as string, options, mode);
  }

  /** A key list; bad input rejects, never throws synchronously. */
  private async obtainList(
    list: readonly string[],
    options: AcquireOptions | undefined,
    mode: AcquireMode,
  ): Promise<ChainLock | null> {
    const keys = lockOrder(list);
    return keys.length === 1
      ? this.obtain(keys[0], options, mode)
      : this.obtainAll(keys, options, mode);
  }

  /**
   * Several keys, all or none: first, where the backend can, every key in one script if all are
   * free; otherwise each through `obtain()`, in `keys`' order (sorted: the same for every caller,
   * so no two callers each hold a key the other waits for), with one token and one deadline.
   * Without auto-extension the keys already held would run out meanwhile: the wait for a later key
   * also ends early enough for its reply to land inside their leases (`keyWaitEnd`), and the lock
   * is only returned if every key's lease is still running. Any failure releases what was taken;
   * when Redis fails, without waiting for those releases (they are bounded and logged).
   */
  private async obtainAll(
    keys: readonly string[],
    options: AcquireOptions | undefined,
    mode: AcquireMode,
  ): Promise<MultiKeyLock | null> {
    const opts = resolveAcquireOptions(keys[0], options, this.defaults, mode);
    const token = opts.token ?? freshToken();
    const started = performance.now();
    const handles: KeyHold[] = [];
    try {
      // Free keys in one step where it can be done (not when the chain re-enters some of them).
      if (
        opts.shape === PLAIN &&
        opts.token === undefined &&
        !keys.some((key) => findChainLock(this, key))
      ) {
        handles.push(...(await this.attemptAll(keys, token, opts, started)));
      }
      for (const key of keys.slice(handles.length)) {
        const until = opts.autoExtend
          ? started + opts.acquireTimeout
          : Math.min(started + opts.acquireTimeout, this.keyWaitEnd(handles));
        const acquireTimeout = Math.max(0, Math.ceil(until - performance.now()));
        const handle = await this.obtain(key, { ...options, acquireTimeout }, mode, token);
        if (!handle) break; // tryAcquire: that key is taken
        handles.push(handle);
      }
    } catch (error) {
      if (error instanceof LockBackendError) {
        void this.releaseAll(handles);
        throw error;
      }
      await this.releaseAll(handles);
      if (!(error instanceof LockAcquireTimeoutError)) throw error;
      // The whole call's wait, against the caller's own acquireTimeout.
      const waited = performance.now() - started;
      throw new LockAcquireTimeoutError(error.key, waited, opts.acquireTimeout, error.retryAfterMs);
    }
    // A key whose lease ran out (or was lost) while a later one was being taken: not all held.
    const now = performance.now();
    const lapsed = handles.find((handle) => handle.lossReason || handle.expiresAt <= now);
    if (handles.length < keys.length || lapsed) {
      await this.releaseAll(handles);
      if (!lapsed || mode === 'tryAcquire') return null;
      throw new LockAcquireTimeoutError(lapsed.key, now - started, opts.acquireTimeout, undefined);
    }
    return new MultiKeyLock(handles);
  }

  /**
   * Without auto-extension, when the wait for the next key must end: before the earliest lease of
   * the keys held, by the time a reply may take (`commandTimeout`), but by no more than half of
   * what is left of that lease, so a short TTL still leaves a wait.
   */
  private keyWaitEnd(handles: readonly KeyHold[]): number {
    if (handles.length === 0) return Infinity;
    const earliest = Math.min(...handles.map((handle) => handle.expiresAt));
    const left = earliest - performance.now();
    return earliest - Math.min(this.commandTimeout, left / 2);
  }

  /**
   * Undoes a partial multi-key acquisition (no work ran: a lease that ran out is no news); what
   * cannot be released expires after its TTL, logged as by `releaseQuietly`.
   */
  private async releaseAll(handles: readonly KeyHold[]): Promise<void> {
    await Promise.all(handles.map((handle) => this.releaseQuietly(handle, true)));
  }

  /**
   * The one acquire loop behind acquire(), tryAcquire(), using() and @WithLock. `ownToken`: the
   * token of a multi-key acquisition (generated here, so not the caller's own).
   */
  private async obtain(
    key: string,
    options: AcquireOptions | undefined,
    mode: AcquireMode,
    ownToken?: string,
  ): Promise<KeyHold | null> {
    const opts = resolveAcquireOptions(key, options, this.defaults, mode);
    const { shape } = opts;
    if (shape !== PLAIN && !this.backend.shapes) {
      const [option, value] =
        shape.mode === 'read'
          ? ['mode', 'read']
          : shape.fair
            ? ['fair', true]
            : ['limit', shape.limit];
      throw new LockArgumentError(
        `${option} + nodes`,
        value,
        'counting semaphores, read locks and fair locks need one Redis deployment: Redlock mode (the module option `nodes`) does not offer them',
      );
    }
    const chained = findChainLock(this, key);
    if (chained) return this.reenter(key, chained, options, opts, mode, ownToken);

    const token = opts.token ?? ownToken ?? freshToken();
    const started = performance.now();
    const deadline = started + opts.acquireTimeout;
    let subscription: ReleaseSubscription | undefined;
    let handle: LockHandle | undefined;
    let signals: (AbortSignal | undefined)[] | undefined;
    // Callers in this process already wait for the key: queue behind them instead of trying at
    // once, so that a holder that releases and asks again cannot barge in ahead of the waiter its
    // release wakes (see Waiting in the README).
    // (Not a fair waiter: it queues in Redis, where its turn is decided.)
    // Nor a semaphore's: callers with different limits queue on one key, and a place free for
    // this one's limit goes to whoever asks first.
    let queueFirst =
      opts.acquireTimeout > 0 && !shape.fair && shape.limit === 1 && this.backend.hasWaiters(key);
    /** A fair waiter hears on its own channel that it is its turn. */
    const turnOf = shape.fair ? token : undefined;
    // A waiter may be handed the lock by a release in this process (not with the caller's own
    // token, which may hold the lock already).
    // Nor for a semaphore: a place freed by a release goes to whoever asks first.
    const claim =
      opts.token === undefined && shape === PLAIN ? { token, ttl: opts.ttl } : undefined;
    if (queueFirst) subscription = this.backend.watchReleases(key, claim, turnOf);
    let handoff: Handoff | undefined;
    try {
      for (;;) {
        const seen = subscription?.seen ?? 0;
        let sentAt = performance.now();
        let attempt: AcquireAttempt;
        if (handoff) {
          const { fence, fenceLimit, validity } = handoff;
          attempt = { acquired: true, fence, fenceLimit, validity };
          sentAt = handoff.sentAt;
        } else {
          this.throwIfStopped(key, opts.signal);
          attempt = queueFirst ? QUEUED : await this.attempt(key, token, opts);
          queueFirst = false;
        }
        if (attempt.acquired && sentAt + attempt.validity <= performance.now()) {
          // Granted, but the answer came after the lease it grants had run out (a slow link, a
          // stalled process): no use to the caller, and Redis lets the key go any moment. Undone
          // (not with the caller's own token, which may hold the lock already), and counted as a
          // failed attempt: the caller never gets a lock whose lease is over.
          if (opts.token === undefined) this.undoing(this.backend.release(key, token, shape));
          attempt = { acquired: false, retryAfter: undefined };
        }
        if (attempt.acquired) {
          handle = this.hold(key, token, attempt, sentAt, opts, handoff?.swap);
          this.reportAcquired(handle, started);
          if (this.stopping.signal.aborted) {
            // Granted while shutdown began: shutdown has already swept the held locks.
            await handle.abandon().catch(() => false);
            throw new RedisLockShutdownError(key);
          }
          return handle;
        }
        // Woken for nothing: the next waiter may take what this one could not (a semaphore's
        // place for a higher limit, a read lock behind a writer's wait).
        if (shape !== PLAIN && attempt !== QUEUED) subscription?.passOnWake();
        const remaining = deadline - performance.now();
        if (remaining <= 0) return this.timedOut(key, started, opts, mode, attempt.retryAfter);
        signals ??= [opts.signal, this.stopping.signal];
        if (!subscription) {
          // Subscribe, then try again at once: a release between the failed attempt and the
          // subscription would otherwise go unnoticed until the timer. A subscription that is
          // not confirmed in time leaves the waiter on timers; the next attempt tells the rest.
          subscription = this.backend.watchReleases(key, claim, turnOf);
          await within(subscription.ready, Math.min(remaining, this.commandTimeout), signals).catch(
            ignoreDeadline,
          );
          continue;
        }
        const pause =
          Math.min(attempt.retryAfter ?? Infinity, this.defaults.retryInterval) +
          Math.random() * this.defaults.retryJitter;
        // A wait cut short by the deadline ends just past it (timers have millisecond grain and
        // may fire a fraction early): the attempt after it is the last, not one of several.
        handoff = await subscription.wait(seen, pause, Math.ceil(remaining) + 1, signals);
      }
    } catch (error) {
      throw this.waitEnded(key, opts.signal, error);
    } finally {
      subscription?.dispose(handle !== undefined, shape.mode === 'read');
      if (!handle && opts.acquireTimeout > 0 && (shape.fair || shape === PLAIN)) {
        // A waiter that gives up leaves nothing: a fair one leaves the queue at once (the next in
        // line is told), a writer takes back its mark on read locks.
        this.backend.giveUp(key, token, shape).catch(() => {
          // Its place, or its mark, lapses by itself within the queue's stay.
        });
      }
    }
  }

  /**
   * A call nested in the flow of a hold on `key` (`chained`): a view of it (see `LockReentry`), or,
   * while another call nested in the same flow is inside (a fork: promises run side by side, a
   * timer), a wait for its turn, bounded by the deadline and the signal as any wait. If the hold
   * ends meanwhile, the call acquires the key as any other would.
   */
  private async reenter(
    key: string,
    chained: KeyHold,
    options: AcquireOptions | undefined,
    opts: ResolvedAcquireOptions,
    mode: AcquireMode,
    ownToken: string | undefined,
  ): Promise<KeyHold | null> {
    const started = performance.now();
    const deadline = started + opts.acquireTimeout;
    const signals = [opts.signal, this.stopping.signal];
    for (let held: KeyHold | undefined = chained; held; held = findChainLock(this, key)) {
      assertReentry(key, held, options, opts.shape);
      this.throwIfStopped(key, opts.signal);
      const view = held.enter();
      if (view) return view;
      const remaining = deadline - performance.now();
      if (remaining <= 0) {
        const left = Math.max(0, held.expiresAt - performance.now());
        return this.timedOut(key, started, opts, mode, left);
      }
      await within(held.turnChanged(), Math.ceil(remaining), signals).catch((error: unknown) => {
        if (error !== DEADLINE) throw this.waitEnded(key, opts.signal, error);
      });
    }
    // The hold ended while this call waited: it takes the key as any caller, in the time left.
    const acquireTimeout = Math.max(0, Math.ceil(deadline - performance.now()));
    return this.obtain(key, { ...options, acquireTimeout }, mode, ownToken);
  }

  /**
   * One acquisition attempt, bounded by `commandTimeout` and the caller's signal (not by the
   * deadline: an answer that comes after it still counts). A reply that comes after the attempt
   * was given up and says we got the lock is answered with a release, so an abandoned attempt
   * never leaves a lock behind (unless the token is the caller's, which may hold it already).
   */
  private attempt(
    key: string,
    token: string,
    opts: ResolvedAcquireOptions,
  ): Promise<AcquireAttempt> {
    const pending = this.backend.tryAcquire(
      key,
      token,
      opts.ttl,
      opts.shape,
      opts.acquireTimeout > 0,
      opts.token === undefined,
    );
    return this.deadlines.bound(pending, opts.signal, true, (error) => {
      const failure = this.failure(key, 'acquire', opts.signal, error);
      if (opts.token === undefined) {
        this.undoLateGrant(failure, pending, (late) =>
          late.acquired ? this.backend.release(key, token, opts.shape) : undefined,
        );
      }
      return failure;
    });
  }

  /**
   * Plain locks on several free keys in one round trip, where the backend can (see
   * `LockBackend.tryAcquireAll`). Resolves [] when it cannot or a key is taken: the caller then
   * goes key by key, waiting as usual.
   */
  private async attemptAll(
    keys: readonly string[],
    token: string,
    opts: ResolvedAcquireOptions,
    started: number,
  ): Promise<LockHandle[]> {
    this.throwIfStopped(keys[0], opts.signal);
    const sentAt = performance.now();
    const pending = this.backend.tryAcquireAll(keys, token, opts.ttl);
    if (!pending) return [];
    let fences: number[] | { retryAfter: number | undefined };
    try {
      fences = await this.reply(keys[0], 'acquire', pending, opts.signal, true);
    } catch (error) {
      this.undoLateGrant(error, pending, (late) =>
        Array.isArray(late)
          ? Promise.all(keys.map((key) => this.backend.release(key, token)))
          : undefined,
      );
      throw error;
    }
    if (!Array.isArray(fences)) return [];
    const validity = this.backend.validity(opts.ttl);
    const handles = keys.map((key, i) =>
      this.hold(key, token, { acquired: true, fence: fences[i], validity }, sentAt, opts),
    );
    for (const handle of handles) this.reportAcquired(handle, started);
    if (this.stopping.signal.aborted) {
      // Granted while shutdown began: shutdown has already swept the held locks.
      await Promise.all(handles.map((handle) => handle.abandon().catch(() => false)));
      throw new RedisLockShutdownError(keys[0]);
    }
    return handles;
  }

  /**
   * After `reply()` gave up on an acquisition (no reply in time, or aborted; not when Redis
   * answered with an error), a grant that arrives later is undone, so an abandoned attempt never
   * leaves a lock behind.
   */
  private undoLateGrant<T>(
    error: unknown,
    pending: Promise<T>,
    undo: (late: T) => Promise<unknown> | undefined,
  ): void {
    if (error instanceof LockBackendError && !error.timedOut) return;
    this.undoing(pending.then(undo));
  }

  /**
   * Follows an undo sent on its own (a late grant's release): shutdown waits for it before it
   * closes the connections, since a release queued behind their QUIT would never run. A failure
   * is dropped: there was nothing to undo, or the lock expires after its TTL.
   */
  private undoing(undo: Promise<unknown>): void {
    const forget = (): void => void this.undos.delete(settled);
    const settled: Promise<void> = undo.then(forget, forget);
    this.undos.add(settled);
  }

  /** The `acquired` event, built only when someone listens. */
  private reportAcquired(handle: LockHandle, started: number): void {
    if (!this.lockEvents.observed) return;
    const waitedMs = performance.now() - started;
    this.lockEvents.emit({ type: 'acquired', key: handle.key, fence: handle.fence, waitedMs });
  }

  /**
   * Waits for one Redis reply for at most `commandTimeout`, or until `signal` aborts or, for an
   * `interruptible` one (an acquisition attempt), shutdown begins: then it rejects with the abort
   * reason. Every other failure becomes a `LockBackendError` naming the operation; a reply that
   * never comes is one with `timedOut: true`.
   */
  private reply<T>(
    key: string,
    operation: LockOperation,
    pending: Promise<T>,
    signal?: AbortSignal,
    interruptible = false,
  ): Promise<T> {
    return this.deadlines.bound(pending, signal, interruptible, (error) =>
      this.failure(key, operation, signal, error),
    );
  }

  /** What `reply()` rejects with when `error` ended the wait (see `reply`). */
  private failure(
    key: string,
    operation: LockOperation,
    signal: AbortSignal | undefined,
    error: unknown,
  ): Error {
    if (error === DEADLINE) {
      const silence = new Error(
        this.backend.replyTimeout === this.commandTimeout
          ? `no reply within commandTimeout (${this.commandTimeout} ms)`
          : `no answer within ${this.backend.replyTimeout} ms (Redlock: two rounds of commandTimeout)`,
      );
      return new LockBackendError(key, operation, silence, true);
    }
    if (
      error === this.stopping.signal.reason ||
      (signal?.aborted && error === signal.reason) ||
      error instanceof LockBackendError
    ) {
      return error as Error;
    }
    return new LockBackendError(key, operation, error);
  }

  private hold(
    key: string,
    token: string,
    attempt: Extract<AcquireAttempt, { acquired: true }>,
    sentAt: number,
    opts: ResolvedAcquireOptions,
    swap?: PendingSwap,
  ): LockHandle {
    const handle = new LockHandle(
      key,
      token,
      attempt.fence,
      opts.ttl,
      sentAt,
      sentAt + attempt.validity,
      opts.autoExtend,
      this.hooks,
      opts.shape,
      attempt.fenceLimit,
      swap,
    );
    if (opts.holdAtLeast > 0) handle.holdFor(opts.holdAtLeast);
    this.held.push(handle);
    return handle;
  }

  /** Releases `lock` after its work (`undo`: after none), logging instead of throwing. */
  private async releaseQuietly(lock: ChainLock, undo = false): Promise<void> {
    // Named only when there is something to say (a release that went well builds no string).
    const name = (): string =>
      lock instanceof MultiKeyLock
        ? `Locks ${lock.keys.map((key) => `"${key}" (fence ${lock.fences[key]})`).join(', ')}`
        : `Lock "${lock.key}" (fence ${lock.fence})`;
    try {
      const released = await lock.release();
      if (undo) return;
      // Read without creating the signal, which nobody may have asked for.
      const lost = lock.lossReason;
      if (lost) {
        this.logger.warn(`${name()}: lost before the work finished: ${String(lost)}`);
      } else if (!released) {
        this.logger.warn(`${name()}: no longer held when the work finished.`);
      }
    } catch (error) {
      this.logger.error(`${name()}: could not release; it expires after its TTL: ${String(error)}`);
    }
  }

  /**
   * A wait that ran out of time: the `timeout` event, then `null` for `tryAcquire()`, else a
   * `LockAcquireTimeoutError` (`retryAfter`: how long the holder's lease still runs, if known).
   */
  private timedOut(
    key: string,
    started: number,
    opts: ResolvedAcquireOptions,
    mode: AcquireMode,
    retryAfter: number | undefined,
  ): null {
    const waitedMs = performance.now() - started;
    if (this.lockEvents.observed) this.lockEvents.emit({ type: 'timeout', key, waitedMs });
    if (mode === 'tryAcquire') return null;
    throw new LockAcquireTimeoutError(key, waitedMs, opts.acquireTimeout, retryAfter);
  }

  /** What a wait ended by the caller's signal or by shutdown rejects with (else `error`). */
  private waitEnded(key: string, signal: AbortSignal | undefined, error: unknown): unknown {
    if (signal?.aborted && error === signal.reason) return new LockAcquireAbortedError(key, error);
    if (error === this.stopping.signal.reason) return new RedisLockShutdownError(key);
    return error;
  }

  private throwIfStopped(key: string, signal: AbortSignal | undefined): void {
    if (signal?.aborted) throw new LockAcquireAbortedError(key, signal.reason);
    if (this.stopping.signal.aborted) throw new RedisLockShutdownError(key);
  }

  private ownHandle(lock: Lock): ChainLock {
    if (
      !(
        lock instanceof LockHandle ||
        lock instanceof LockReentry ||
        lock instanceof MultiKeyLock
      ) ||
      !lock.belongsTo(this.hooks)
    ) {
      throw new LockArgumentError('lock', lock, 'must be a lock returned by this LockService');
    }
    return lock;
  }
}
