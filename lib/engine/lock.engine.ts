import type { Logger } from '@nestjs/common';
import { LockArgumentError, RedisLockShutdownError } from '../errors/redis-lock.errors.js';
import type {
  BackendHealth,
  Election,
  Freed,
  Inspection,
  LockBackend,
} from '../interfaces/lock-backend.interface.js';
import type { AcquireOptions, Lock } from '../interfaces/lock.interface.js';
import { lockOrder } from '../options/checks.js';
import { LOSS_REPORTED, resolveCallOptions, type AcquireMode } from '../options/acquire-options.js';
import { type ResolvedModuleOptions } from '../options/module-options.js';
import { createLockBackend } from '../redis/lock-backend.factory.js';
import { LinkedList } from '../utils/linked-list.js';
import { ignoreDeadline, within } from '../utils/within.js';
import { AcquireLoop } from './acquire-loop.js';
import type { EngineParts } from './engine.parts.js';
import { runHoldingLock, type ChainLock } from './lock.context.js';
import { LockEvents } from './lock.events.js';
import { LockHandle } from './lock.handle.js';
import { LockReentry } from './lock.reentry.js';
import { MultiKeyLock } from './multi-key-lock.handle.js';
import { MultiKeyAcquisition } from './multi-key.acquisition.js';
import { Replies } from './replies.js';
import { Waiters } from './waiters.js';

/** One key, or several to lock together (all or none). */
export type Keys = string | readonly string[];

/**
 * The lock engine behind one `LockService`: takes locks through one acquire loop
 * (`AcquireLoop`, and `MultiKeyAcquisition` for several keys), keeps them (`LockHandle`: lease,
 * watchdog, release), and shuts down within bounds. Knows nothing of Nest but its `Logger`.
 */
export class LockEngine {
  readonly events: LockEvents;
  private readonly parts: EngineParts;
  private readonly backend: LockBackend;
  private readonly loop: AcquireLoop;
  private readonly multi: MultiKeyAcquisition;
  private readonly stopping = new AbortController();
  private readonly stopWatchingReconnects: () => void;

  constructor(options: ResolvedModuleOptions, logger: Logger) {
    const backend = (this.backend = createLockBackend(options, logger));
    const view = options.defaults.keyView;
    const replies = new Replies(backend, options.commandTimeout, this.stopping.signal, view);
    const held = new LinkedList<LockHandle>();
    this.events = new LockEvents(logger, view);
    this.parts = {
      backend,
      defaults: options.defaults,
      commandTimeout: options.commandTimeout,
      logger,
      events: this.events,
      replies,
      held,
      stopping: this.stopping.signal,
      waiters: new Waiters(options.maxWaiters),
      hooks: {
        backend,
        logger,
        events: this.events,
        view,
        reply: (key, operation, pending) => replies.reply(key, operation, pending),
        settled: (lock) => held.remove(lock),
      },
    };
    this.loop = new AcquireLoop(this.parts);
    this.multi = new MultiKeyAcquisition(this.parts, this.loop, (lock) =>
      this.releaseQuietly(lock, true),
    );
    // Redis may have restarted empty or failed over while the connection was down: check every
    // held lock at once instead of waiting for its next extension (or none, without autoExtend).
    this.stopWatchingReconnects = backend.onReconnect(() => {
      for (const lock of held.toArray()) void lock.verify();
    });
  }

  /**
   * One key (straight to the acquire loop: no extra promise on the hot path), or several, checked
   * and put in the one order every caller uses (`lockOrder`). Bad input rejects, never throws.
   */
  acquire(
    key: Keys,
    options: AcquireOptions | undefined,
    mode: AcquireMode,
  ): Promise<ChainLock | null> {
    return Array.isArray(key)
      ? this.acquireList(key as readonly string[], options, mode)
      : this.loop.obtain(key as string, options, mode);
  }

  /** Runs `fn` holding the lock (see `LockService.using`); a failed release is logged. */
  async using<T>(
    key: Keys,
    fn: (lock: Lock) => T | Promise<T>,
    options?: AcquireOptions,
  ): Promise<T> {
    if (typeof fn !== 'function') throw new LockArgumentError('fn', fn, 'must be a function');
    const lock = (await this.acquire(key, options, 'using'))!;
    try {
      return await runHoldingLock(this.parts.hooks, lock, () => fn(lock));
    } finally {
      // A leader's campaign says itself that its term was lost ("Lost leadership of …").
      await this.releaseQuietly(
        lock,
        false,
        !(options as Record<symbol, unknown>)?.[LOSS_REPORTED],
      );
    }
  }

  release(lock: Lock): Promise<boolean> {
    return this.ownHandle(lock).release();
  }

  extend(lock: Lock, ttl?: number): Promise<void> {
    return this.ownHandle(lock).extend(ttl);
  }

  isLocked(key: string): Promise<boolean> {
    return this.parts.replies.reply(key, 'isLocked', this.backend.isLocked(key));
  }

  /** What holds `key` now (see `LockBackend.inspect`). */
  inspect(key: string): Promise<Inspection> {
    return this.parts.replies.reply(key, 'inspect', this.backend.inspect(key));
  }

  /**
   * Frees `key` whatever holds it, for an operator (see `LockBackend.forceRelease`), and says so:
   * a warning naming `reason`, a `forced` event. Locks of this process that held the key are
   * checked at once (see `LockHandle.verify`), so that their signals abort now instead of at their
   * next extension; a lock taken after the release began is not touched.
   */
  async forceRelease(key: string, reason: string): Promise<Freed> {
    const before = this.parts.held.toArray().filter((lock) => lock.key === key);
    const sentAt = performance.now();
    const freed = await this.parts.replies.reply(
      key,
      'forceRelease',
      this.backend.forceRelease(key),
    );
    const { events, logger, defaults } = this.parts;
    logger.warn(
      `Lock ${defaults.keyView(key)} force-released (${freed.holders} ${freed.mode ?? 'no'} holder${freed.holders === 1 ? '' : 's'} freed, fence ${freed.fence}): ${reason}`,
    );
    if (events.observed) events.emit({ type: 'forced', key, reason, ...freed });
    // Also a holder whose grant was asked for before the force but came in meanwhile (the force
    // freed it: Redis answered the grant first); not one asked for after it.
    const since = this.parts.held
      .toArray()
      .filter((lock) => lock.key === key && lock.askedBy(sentAt) && !before.includes(lock));
    await Promise.all([...before, ...since].map((lock) => lock.verify()));
    return freed;
  }

  /** Who leads `key` and, with `participants`, who campaigns for it (see `LockBackend.election`). */
  election(key: string, participants: boolean): Promise<Election> {
    return this.parts.replies.reply(key, 'inspect', this.backend.election(key, participants));
  }

  /** A term of `key` began, held by `lock`, led by participant `id`: recorded for all to read. */
  recordTerm(lock: Lock, id: string, ttl: number): Promise<void> {
    const { key, token, fence } = lock;
    return this.parts.replies.reply(
      key,
      'campaign',
      this.backend.recordTerm(key, token, id, fence, ttl),
    );
  }

  /** A campaign's `entry` stays among `key`'s participants `stay` more ms (0: it stopped). */
  participate(key: string, entry: string, stay: number): Promise<void> {
    return this.parts.replies.reply(key, 'campaign', this.backend.participate(key, entry, stay));
  }

  /**
   * Settles once no attempt this process gave up on may still hold `key` (its late grant undone),
   * or after twice `commandTimeout` (a reply, then the undo's).
   */
  async undone(key: string): Promise<void> {
    const undos = this.parts.replies.undosOf(key);
    if (undos) await within(undos, 2 * this.parts.commandTimeout, []).catch(ignoreDeadline);
  }

  /** Startup (see `LockService.onApplicationBootstrap`); a failure shuts the engine down first. */
  async prepare(): Promise<void> {
    try {
      await this.backend.prepare();
    } catch (error) {
      await this.shutdown();
      throw error;
    }
  }

  health(): Promise<BackendHealth> {
    return this.backend.health();
  }

  /** Until shutdown begins. */
  get running(): boolean {
    return !this.stopping.signal.aborted;
  }

  /** Throws `RedisLockShutdownError` once shutdown has begun. */
  assertRunning(key: string): void {
    if (this.stopping.signal.aborted) {
      throw new RedisLockShutdownError(key, this.parts.defaults.keyView);
    }
  }

  /**
   * Rejects pending acquisitions, stops watchdogs, releases every held lock (their signals abort
   * with reason `shutdown`) and closes the connections the engine created, all within one
   * deadline of twice `commandTimeout`: an attempt in flight may be granted up to `commandTimeout`
   * late, and its undo takes another. Everything sent before it closes a connection — those undos,
   * the releases of held locks, releases still in flight (a hand-over to a waiter this shutdown
   * rejected, and that waiter's own release of what it was handed) — is waited for, up to the
   * deadline; then QUIT in what time is left, or, with none left, the connections are dropped.
   * Releases that get no reply are logged, and their locks expire after their TTL.
   */
  async shutdown(): Promise<void> {
    if (this.stopping.signal.aborted) return;
    const deadline = performance.now() + 2 * this.parts.commandTimeout;
    this.stopping.abort(new RedisLockShutdownError('*'));
    // The grants of attempts shutdown interrupted, undone before the connections close.
    this.parts.replies.interrupt(this.stopping.signal.reason as Error);
    this.stopWatchingReconnects();
    const locks = this.parts.held.toArray();
    const [results, unanswered] = await Promise.all([
      Promise.allSettled(locks.map((lock) => lock.abandon())),
      this.parts.replies.undone(deadline),
    ]);
    if (unanswered.length > 0) {
      // An attempt shutdown gave up whose reply (or its undo's) has not come by the deadline: a
      // grant that lands anyway stays until its TTL. Said, never silent.
      this.parts.logger.warn(
        `Shutdown's deadline (2 × commandTimeout) passed before Redis answered an abandoned attempt on ${unanswered.map((key) => this.parts.defaults.keyView(key)).join(', ')}: if Redis granted it, the lock stays until its TTL.`,
      );
    }
    results.forEach((result, i) => {
      if (result.status === 'rejected') {
        this.parts.logger.warn(
          `Could not release lock ${this.parts.defaults.keyView(locks[i].key)} (fence ${locks[i].fence}) on shutdown; it expires after its TTL: ${String(result.reason)}`,
        );
      }
    });
    await this.backend.close(deadline);
    this.events.complete();
  }

  /** A key list: one key goes on as one; bad input rejects. */
  private async acquireList(
    list: readonly string[],
    options: AcquireOptions | undefined,
    mode: AcquireMode,
  ): Promise<ChainLock | null> {
    const keys = lockOrder(list, this.parts.defaults);
    const opts = resolveCallOptions(options, this.parts.defaults, mode);
    return keys.length === 1
      ? this.loop.obtain(keys[0], options, mode, opts)
      : this.multi.obtainAll(keys, opts, options, mode);
  }

  /** Releases `lock` after its work (`undo`: after none), logging instead of throwing. */
  private async releaseQuietly(lock: ChainLock, undo = false, reportLoss = true): Promise<void> {
    const { logger } = this.parts;
    const view = this.parts.defaults.keyView;
    // Named only when there is something to say (a release that went well builds no string).
    const name = (): string =>
      lock instanceof MultiKeyLock
        ? `Locks ${lock.keys.map((key) => `${view(key)} (fence ${lock.fences[key]})`).join(', ')}`
        : `Lock ${view(lock.key)} (fence ${lock.fence})`;
    try {
      if (undo) return void (await lock.undo());
      const released = await lock.release();
      // Read without creating the signal, which nobody may have asked for.
      const lost = lock.lossReason;
      if (lost) {
        if (reportLoss) logger.warn(`${name()}: lost before the work finished: ${String(lost)}`);
      } else if (!released) {
        logger.warn(`${name()}: no longer held when the work finished.`);
      }
    } catch (error) {
      logger.error(`${name()}: could not release; it expires after its TTL: ${String(error)}`);
    }
  }

  private ownHandle(lock: Lock): ChainLock {
    if (
      !(
        lock instanceof LockHandle ||
        lock instanceof LockReentry ||
        lock instanceof MultiKeyLock
      ) ||
      !lock.belongsTo(this.parts.hooks)
    ) {
      throw new LockArgumentError('lock', lock, 'must be a lock returned by this LockService');
    }
    return lock;
  }
}
