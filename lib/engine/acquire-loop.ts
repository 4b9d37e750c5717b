import {
  LockAcquireAbortedError,
  LockAcquireTimeoutError,
  LockArgumentError,
  RedisLockShutdownError,
} from '../errors/redis-lock.errors.js';
import type {
  AcquireAttempt,
  Handoff,
  ReleaseSubscription,
} from '../interfaces/lock-backend.interface.js';
import type { AcquireOptions } from '../interfaces/lock.interface.js';
import { PLAIN } from '../options/checks.js';
import {
  resolveAcquireOptions,
  type AcquireMode,
  type ResolvedAcquireOptions,
} from '../options/acquire-options.js';
import { freshToken } from '../utils/token.js';
import { DEADLINE, ignoreDeadline, within } from '../utils/within.js';
import type { EngineParts } from './engine.parts.js';
import { findChainLock } from './lock.context.js';
import { holdGranted, reportAcquired } from './lock.grant.js';
import type { LockHandle } from './lock.handle.js';
import { assertReentry } from './lock.reentry.js';
import type { KeyHold } from './multi-key-lock.handle.js';
import type { WaiterLimit } from './waiters.js';

/**
 * What a caller that queues behind this process's waiters starts from: no attempt made yet (they
 * wait because the key is held).
 */
const QUEUED: Extract<AcquireAttempt, { acquired: false }> = {
  acquired: false,
  retryAfter: undefined,
  held: true,
};
/** The first pause after a second split vote in a row, in ms (see the wait below). */
const SPLIT_PAUSE = 10;

/** A grant whose reply came after its lease had run out: a failed attempt, nobody else's fault. */
const TOO_LATE: AcquireAttempt = { acquired: false, retryAfter: undefined, held: false };

/**
 * The one acquire loop behind acquire(), tryAcquire(), using(), @WithLock and lead(): attempts,
 * waits for a release (pub/sub, in-process handoff, timers), re-entry within a call chain, and
 * the end of a wait (timeout, abort, shutdown). Keys and options come in checked.
 */
export class AcquireLoop {
  constructor(private readonly parts: EngineParts) {}

  /**
   * Takes `key`. `given`: the options as the caller wrote them, checked here (the one check of a
   * call's key and options) unless they come `resolved` already, from a call that checked them (a
   * nested call may only repeat the hold's options, so they travel along); `ownToken`: the token
   * of a multi-key acquisition this call is part of (generated there, so not the caller's own;
   * that call reports its own timeout, so this one emits no `timeout` event).
   */
  async obtain(
    key: string,
    given: AcquireOptions | undefined,
    mode: AcquireMode,
    resolved?: ResolvedAcquireOptions,
    ownToken?: string,
  ): Promise<KeyHold | null> {
    const { backend, replies, defaults, commandTimeout } = this.parts;
    const opts = resolved ?? resolveAcquireOptions(key, given, defaults, mode);
    const { shape } = opts;
    if (shape !== PLAIN && !backend.shapes) {
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
    const chained = findChainLock(this.parts.hooks, key);
    if (chained) return this.reenter(key, chained, opts, given, mode, ownToken);

    let token = opts.token ?? ownToken ?? freshToken();
    const started = performance.now();
    const deadline = started + opts.acquireTimeout;
    let subscription: ReleaseSubscription | undefined;
    let handle: LockHandle | undefined;
    let signals: (AbortSignal | undefined)[] | undefined;
    /** Whether this call already waited for an undo of this process's own (see below). */
    let waitedForUndo = false;
    /** Split votes in a row (Redlock mode): each pause after the first twice as long. */
    let splits = 0;
    /** The last attempt sent, as Redis answers it: a give-up goes after it (see `finally`). */
    let sent: Promise<AcquireAttempt> | undefined;
    // Callers in this process already wait for the key: queue behind them instead of trying at
    // once, so that a holder that releases and asks again cannot barge in ahead of the waiter its
    // release wakes (see Waiting in the README).
    // (Not a fair waiter: it queues in Redis, where its turn is decided.)
    // Nor a semaphore's: callers with different limits queue on one key, and a place free for
    // this one's limit goes to whoever asks first.
    let queueFirst =
      opts.acquireTimeout > 0 && !shape.fair && shape.limit === 1 && backend.hasWaiters(key);
    /** A fair waiter hears on its own channel that it is its turn. */
    const turnOf = shape.fair ? token : undefined;
    // A waiter may be handed the lock by a release in this process (not with the caller's own
    // token, which may hold the lock already).
    // Nor for a semaphore: a place freed by a release goes to whoever asks first.
    const claim =
      opts.token === undefined && shape === PLAIN ? { token, ttl: opts.ttl } : undefined;
    /** Whether this call counts among the key's waiters, or was refused by `maxWaiters`. */
    let waiting = false;
    let refused: WaiterLimit | undefined;
    // With `maxWaiters` full already, the first attempt asks Redis for the key as `tryAcquire()`
    // does: it joins no queue and marks no read lock, so its refusal leaves nothing to take back
    // (a stream of refused writers would otherwise keep wiping the mark other writers wait on).
    let mayWait = opts.acquireTimeout > 0 && !(opts.counted && this.parts.waiters.full(key));
    /** Whether an attempt that may wait was sent: what a refused caller has to take back. */
    let askedToWait = false;
    let handoff: Handoff | undefined;
    /** The undo of a grant that came too late (see below), while the call's token is the same. */
    let undoing: Promise<unknown> | undefined;
    try {
      if (queueFirst) {
        refused = opts.counted ? this.parts.waiters.enter(key) : undefined;
        if (refused) return this.timedOut(key, started, opts, mode, QUEUED, !!ownToken, refused);
        waiting = opts.counted;
        subscription = backend.watchReleases(key, claim, turnOf);
      }
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
          if (undoing) {
            // After the undo of this token's late grant (see below).
            const signalsNow = [opts.signal, this.parts.stopping];
            await within(undoing, commandTimeout, signalsNow).catch(ignoreDeadline);
            undoing = undefined;
          }
          if (queueFirst) attempt = QUEUED;
          else {
            askedToWait ||= mayWait;
            attempt = await this.attempt(key, token, opts, mayWait, (s) => void (sent = s));
          }
          mayWait = opts.acquireTimeout > 0;
          queueFirst = false;
        }
        if (attempt.acquired && sentAt + attempt.validity <= performance.now()) {
          // Granted, but the answer came after the lease it grants had run out (a slow link, a
          // stalled process): no use to the caller, and Redis lets the key go any moment. Undone
          // at once (its release wakes the waiters elsewhere; not with the caller's own token,
          // which may hold the lock already), and counted as a failed attempt: the caller never
          // gets a lock whose lease is over.
          // A lock passed on in the process is released after its own token write, still in
          // flight: sent before it, the release would find the predecessor's token and leave the
          // heir's lock in Redis for its TTL.
          // The undo may be sent again after NOSCRIPT (Redis lost its scripts), behind what the
          // call sends next: with the same token, it would delete the lock that next attempt, or
          // a hand-over to the call, then gives it. So a call whose token is its own making goes
          // on with a fresh one (a hand-over takes the new one too); any other sends its next
          // attempt once the undo is answered.
          if (opts.token === undefined) {
            const swap = handoff?.swap;
            const late = token;
            const release = (): Promise<boolean> => backend.release(key, late, shape);
            undoing = swap ? swap.then(release, release) : release();
            replies.undoing([key], undoing);
            if (claim && ownToken === undefined) {
              token = claim.token = freshToken();
              undoing = undefined;
            }
          }
          attempt = TOO_LATE;
        }
        if (attempt.acquired) {
          handle = holdGranted(this.parts, key, token, attempt, sentAt, opts, handoff);
          reportAcquired(this.parts, handle, started);
          if (this.parts.stopping.aborted) {
            // Granted while shutdown began: shutdown has already swept the held locks.
            await handle.abandon(true).catch(() => false);
            throw new RedisLockShutdownError(key, this.parts.defaults.keyView);
          }
          return handle;
        }
        // Woken for nothing: the next waiter may take what this one could not (a semaphore's
        // place for a higher limit, a read lock behind a writer's wait).
        if (shape !== PLAIN && attempt !== QUEUED) subscription?.passOnWake();
        signals ??= [opts.signal, this.parts.stopping];
        const undos = attempt.held && !waitedForUndo ? replies.undosOf(key) : undefined;
        if (undos) {
          // The key may be held by this process's own abandoned attempt: one given up on (no
          // reply within commandTimeout, a shutdown, a signal) whose grant came after all, or
          // came too late, and is being undone (after Redis restarted, the attempts queued while
          // it was down are sent at once). Not busy: once the undo is answered (within
          // commandTimeout), one more attempt, past the deadline if need be.
          waitedForUndo = true;
          await within(undos, commandTimeout, signals).catch(ignoreDeadline);
          continue;
        }
        const remaining = deadline - performance.now();
        if (remaining <= 0) {
          return this.timedOut(key, started, opts, mode, attempt, ownToken !== undefined);
        }
        if (!subscription) {
          // Subscribe, then try again at once: a release between the failed attempt and the
          // subscription would otherwise go unnoticed until the timer. A subscription that is
          // not confirmed in time leaves the waiter on timers; the next attempt tells the rest.
          refused = opts.counted ? this.parts.waiters.enter(key) : undefined;
          if (refused) return this.timedOut(key, started, opts, mode, attempt, !!ownToken, refused);
          waiting = opts.counted;
          subscription = backend.watchReleases(key, claim, turnOf);
          await within(subscription.ready, Math.min(remaining, commandTimeout), signals).catch(
            ignoreDeadline,
          );
          continue;
        }
        // A split vote ends as the other waiters' undos land: tried again at once (within the
        // jitter), then, while the votes keep splitting (copies that are not undone: their
        // processes died), after 10, 30, 70 ms… up to `retryInterval` (each split at once, the
        // waiters of the two copies' 8 s ran 150 scripts a second per process: found by a helper).
        splits = !attempt.acquired && attempt.split ? splits + 1 : 0;
        const wait = splits > 0 ? SPLIT_PAUSE * (2 ** (splits - 1) - 1) : attempt.retryAfter;
        const pause =
          Math.min(wait ?? Infinity, defaults.retryInterval) + Math.random() * defaults.retryJitter;
        // A wait cut short by the deadline ends just past it (timers have millisecond grain and
        // may fire a fraction early): the attempt after it is the last, not one of several.
        handoff = await subscription.wait(seen, pause, Math.ceil(remaining) + 1, signals);
      }
    } catch (error) {
      throw this.waitEnded(key, opts.signal, error);
    } finally {
      if (waiting) this.parts.waiters.leave(key);
      subscription?.dispose(handle !== undefined, shape.mode === 'read');
      // A caller `maxWaiters` refused takes back only what it joined: its own place in a fair
      // queue, or, when no other caller of this process that takes turns waits for the key (they
      // keep the process's place and the writers' mark), the process's place and its mark. Not
      // "no other caller at all": readers waiting never take turns, and would leave the process
      // queued for good (found by a helper: a writer refused as readers filled the places).
      const joined =
        refused === undefined || (askedToWait && (shape.fair || !backend.takesTurns(key)));
      if (!handle && joined && opts.acquireTimeout > 0 && (shape.fair || shape === PLAIN)) {
        // A waiter that gives up leaves nothing: a fair one leaves the queue at once (the next in
        // line is told), a writer takes back its mark on read locks, its process the queue of
        // waiting processes. Once its last attempt is answered, and the undo of a grant it got too
        // late: one still on its way (a reply given up on; one sent again after NOSCRIPT, as after
        // a restart) would queue it, or mark it, again behind the give-up, and so would that
        // undo's release, which puts the process back in the queue while callers of it wait (see
        // NAME_NEXT; this one still counted when it was sent).
        const leave = (): Promise<void> => backend.giveUp(key, token, shape);
        const before = [sent, replies.undosOf(key)].filter((pending) => pending !== undefined);
        const after = before.length > 0 ? Promise.allSettled(before).then(leave) : leave();
        after.catch(() => {
          // Its place, or its mark, lapses by itself within the queue's stay.
        });
      }
    }
  }

  throwIfStopped(key: string, signal: AbortSignal | undefined): void {
    const { keyView } = this.parts.defaults;
    if (signal?.aborted) throw new LockAcquireAbortedError(key, signal.reason, keyView);
    if (this.parts.stopping.aborted) throw new RedisLockShutdownError(key, keyView);
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
    opts: ResolvedAcquireOptions,
    given: AcquireOptions | undefined,
    mode: AcquireMode,
    ownToken: string | undefined,
  ): Promise<KeyHold | null> {
    const started = performance.now();
    const deadline = started + opts.acquireTimeout;
    const signals = [opts.signal, this.parts.stopping];
    for (
      let held: KeyHold | undefined = chained;
      held;
      held = findChainLock(this.parts.hooks, key)
    ) {
      assertReentry(key, held, given, opts.shape);
      this.throwIfStopped(key, opts.signal);
      const view = held.enter();
      if (view) return view;
      const remaining = deadline - performance.now();
      if (remaining <= 0) {
        const retryAfter = Math.max(0, held.expiresAt - performance.now());
        const last: AcquireAttempt = { acquired: false, retryAfter, held: true };
        return this.timedOut(key, started, opts, mode, last, ownToken !== undefined);
      }
      await within(held.turnChanged(), Math.ceil(remaining), signals).catch((error: unknown) => {
        if (error !== DEADLINE) throw this.waitEnded(key, opts.signal, error);
      });
    }
    // The hold ended while this call waited: it takes the key as any caller, in the time left.
    const acquireTimeout = Math.max(0, Math.ceil(deadline - performance.now()));
    return this.obtain(key, given, mode, { ...opts, acquireTimeout }, ownToken);
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
    /** Whether the caller will wait if the key is taken (it may queue or mark; see the backend). */
    mayWait: boolean,
    /** Told of the attempt as sent, before its reply is bounded. */
    sending?: (pending: Promise<AcquireAttempt>) => void,
  ): Promise<AcquireAttempt> {
    const { backend, replies } = this.parts;
    const pending = backend.tryAcquire(
      key,
      token,
      opts.ttl,
      opts.shape,
      mayWait,
      opts.token === undefined,
    );
    sending?.(pending);
    return replies.acquisition(pending, opts.signal, (error) => {
      const failure = replies.failure(key, 'acquire', opts.signal, error);
      if (opts.token === undefined) {
        replies.undoLateGrant([key], failure, pending, (late) =>
          late.acquired ? backend.release(key, token, opts.shape) : undefined,
        );
      }
      return failure;
    });
  }

  /**
   * A wait that ran out of time (`last`: its last attempt): the `timeout` event (unless the call is
   * `part` of a multi-key acquisition, which reports its own), then `null` for `tryAcquire()`, else
   * a `LockAcquireTimeoutError` (`retryAfter`: how long the holder's lease still runs, if known;
   * `busy`: whether another holder had the key).
   */
  private timedOut(
    key: string,
    started: number,
    opts: ResolvedAcquireOptions,
    mode: AcquireMode,
    last: Extract<AcquireAttempt, { acquired: false }>,
    part: boolean,
    queueFull?: WaiterLimit,
  ): null {
    const { events } = this.parts;
    const waitedMs = performance.now() - started;
    if (events.observed && !part) {
      events.emit({ type: opts.skipWhenBusy && last.held ? 'skipped' : 'timeout', key, waitedMs });
    }
    if (mode === 'tryAcquire') return null;
    throw new LockAcquireTimeoutError(
      key,
      waitedMs,
      opts.acquireTimeout,
      last.retryAfter,
      last.held,
      events.expectedWaitMs(key, last.retryAfter),
      queueFull && { limit: queueFull, waiters: this.parts.waiters.limit(queueFull) },
      this.parts.defaults.keyView,
    );
  }

  /** What a wait ended by the caller's signal or by shutdown rejects with (else `error`). */
  waitEnded(key: string, signal: AbortSignal | undefined, error: unknown): unknown {
    const { keyView } = this.parts.defaults;
    if (signal?.aborted && error === signal.reason) {
      return new LockAcquireAbortedError(key, error, keyView);
    }
    if (error === this.parts.stopping.reason) return new RedisLockShutdownError(key, keyView);
    return error;
  }
}
