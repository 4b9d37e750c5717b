import {
  LockAcquireTimeoutError,
  LockBackendError,
  RedisLockShutdownError,
} from '../errors/redis-lock.errors.js';
import type { AcquireOptions } from '../interfaces/lock.interface.js';
import { PLAIN } from '../options/checks.js';
import { type AcquireMode, type ResolvedAcquireOptions } from '../options/acquire-options.js';
import { freshToken } from '../utils/token.js';
import type { AcquireLoop } from './acquire-loop.js';
import type { EngineParts } from './engine.parts.js';
import { findChainLock } from './lock.context.js';
import { holdGranted, reportAcquired } from './lock.grant.js';
import type { LockHandle } from './lock.handle.js';
import { MultiKeyLock, type KeyHold } from './multi-key-lock.handle.js';

/**
 * Several keys, all or none: first, where the backend can, every key in one script if all are
 * free; otherwise each through the acquire loop, in `keys`' order (sorted: the same for every
 * caller, so no two callers each hold a key the other waits for), with one token and one
 * deadline. Without auto-extension the keys already held would run out meanwhile: the wait for a
 * later key then ends early enough for its reply to land inside their leases (`keyWaitEnd`). A
 * wait cut short so does not end the call: as Redisson's MultiLock does, the keys held are given
 * back and the whole set is taken again, until `acquireTimeout` — the busy key waited for first,
 * alone (no key held: it cannot deadlock), then the keys before it with one attempt each (never a
 * wait while a later key is held), then the rest in order. The lock is only returned if every
 * key's lease is still running; one that ran out meanwhile (a late reply) also starts the set
 * again. Any failure releases what was taken; when Redis fails, without waiting for those
 * releases (they are bounded and logged).
 */
export class MultiKeyAcquisition {
  constructor(
    private readonly parts: EngineParts,
    private readonly loop: AcquireLoop,
    /** Gives back a lock after no work ran, logging what cannot be released. */
    private readonly undo: (handle: KeyHold) => Promise<void>,
  ) {}

  async obtainAll(
    keys: readonly string[],
    opts: ResolvedAcquireOptions,
    given: AcquireOptions | undefined,
    mode: AcquireMode,
  ): Promise<MultiKeyLock | null> {
    const token = opts.token ?? freshToken();
    const started = performance.now();
    const deadline = started + opts.acquireTimeout;
    // Free keys in one step where it can be done (not when the chain re-enters some of them).
    let handles =
      opts.shape === PLAIN &&
      opts.token === undefined &&
      !keys.some((key) => findChainLock(this.parts.hooks, key))
        ? await this.attemptAll(keys, token, opts, started)
        : [];
    /** The key the last round could not get in time, waited for first by the next. */
    let busy: number | undefined;
    for (;;) {
      const round = await this.takeRound(keys, token, opts, given, mode, deadline, handles, busy);
      handles = [];
      if (round instanceof MultiKeyLock) return round;
      const { key, held, retryAfter, queueFull } = round;
      // Cut short (by the leases of the keys held, or one attempt while a later key was held),
      // or a lease that ran out: the whole set again, while there is time. Not when `maxWaiters`
      // refused a key: the call fails at once, as a call for that key alone does.
      if (!queueFull && mode !== 'tryAcquire' && performance.now() < deadline) {
        busy = held ? keys.indexOf(key) : undefined;
        continue;
      }
      const waitedMs = performance.now() - started;
      const { events } = this.parts;
      if (events.observed) {
        events.emit({ type: opts.skipWhenBusy && held ? 'skipped' : 'timeout', key, waitedMs });
      }
      if (mode === 'tryAcquire') return null;
      throw new LockAcquireTimeoutError(
        key,
        waitedMs,
        opts.acquireTimeout,
        retryAfter,
        held,
        events.expectedWaitMs(key, retryAfter),
        queueFull,
        this.parts.defaults.keyView,
      );
    }
  }

  /**
   * One round over the set (see the class comment), on top of `handles` already held (the first
   * keys, taken in one step): the lock, or, everything given back, the key that stopped it, whether
   * another holder had it (not for a lease that ran out) and for how long still, if known.
   */
  private async takeRound(
    keys: readonly string[],
    token: string,
    opts: ResolvedAcquireOptions,
    given: AcquireOptions | undefined,
    mode: AcquireMode,
    deadline: number,
    handles: KeyHold[],
    busy: number | undefined,
  ): Promise<
    | MultiKeyLock
    | {
        key: string;
        held: boolean;
        retryAfter?: number;
        queueFull?: LockAcquireTimeoutError['queueFull'];
      }
  > {
    const held = new Map<number, KeyHold>(handles.map((handle, i) => [i, handle]));
    const order =
      busy === undefined
        ? keys.map((_, i) => i)
        : [busy, ...keys.map((_, i) => i).filter((i) => i !== busy)];
    let key = keys[0];
    try {
      for (const i of order) {
        if (held.has(i)) continue;
        key = keys[i];
        // Before the busy key, which is held: one attempt, never a wait.
        const until =
          busy !== undefined && i < busy
            ? performance.now()
            : opts.autoExtend
              ? deadline
              : Math.min(deadline, this.keyWaitEnd([...held.values()]));
        const acquireTimeout = Math.max(0, Math.ceil(until - performance.now()));
        const handle = await this.loop.obtain(key, given, mode, { ...opts, acquireTimeout }, token);
        if (!handle) {
          await this.releaseAll(held);
          return { key, held: true }; // tryAcquire: that key is taken
        }
        held.set(i, handle);
      }
    } catch (error) {
      if (error instanceof LockBackendError) {
        void this.releaseAll(held);
        throw error;
      }
      await this.releaseAll(held);
      if (!(error instanceof LockAcquireTimeoutError)) throw error;
      return {
        key,
        held: error.busy,
        retryAfter: error.retryAfterMs,
        queueFull: error.queueFull,
      };
    }
    // A key whose lease ran out (or was lost) while a later one was being taken: not all held.
    const now = performance.now();
    const inOrder = keys.map((_, i) => held.get(i)!);
    const lapsed = inOrder.find((handle) => handle.lossReason || handle.expiresAt <= now);
    if (lapsed) {
      await this.releaseAll(held);
      return { key: lapsed.key, held: false };
    }
    return new MultiKeyLock(inOrder);
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
    return earliest - Math.min(this.parts.commandTimeout, left / 2);
  }

  /** Undoes a partial acquisition (no work ran: a lease that ran out is no news). */
  private async releaseAll(handles: ReadonlyMap<number, KeyHold>): Promise<void> {
    await Promise.all([...handles.values()].map((handle) => this.undo(handle)));
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
    const { backend } = this.parts;
    this.loop.throwIfStopped(keys[0], opts.signal);
    const sentAt = performance.now();
    const pending = backend.tryAcquireAll(keys, token, opts.ttl);
    if (!pending) return [];
    const { replies } = this.parts;
    let fences: number[] | { retryAfter: number | undefined };
    try {
      // The undo of a grant that may still come is registered as the reply is given up (in the
      // rejection itself): shutdown, which gives it up, then waits for that undo before it closes
      // the connection. (Registered a microtask later, it came after shutdown had looked, and the
      // late grant stayed in Redis for its TTL.)
      fences = await replies.acquisition(pending, opts.signal, (error) => {
        const failure = replies.failure(keys[0], 'acquire', opts.signal, error);
        replies.undoLateGrant(keys, failure, pending, (late) =>
          Array.isArray(late)
            ? Promise.all(keys.map((key) => backend.release(key, token)))
            : undefined,
        );
        return failure;
      });
    } catch (error) {
      // The caller's signal or shutdown, as a wait of one key says them.
      throw this.loop.waitEnded(keys[0], opts.signal, error);
    }
    if (!Array.isArray(fences)) return [];
    const validity = backend.validity(opts.ttl);
    const handles = keys.map((key, i) =>
      holdGranted(
        this.parts,
        key,
        token,
        { acquired: true, fence: fences[i], validity },
        sentAt,
        opts,
      ),
    );
    for (const handle of handles) reportAcquired(this.parts, handle, started);
    if (this.parts.stopping.aborted) {
      // Granted while shutdown began: shutdown has already swept the held locks.
      await Promise.all(handles.map((handle) => handle.abandon(true).catch(() => false)));
      throw new RedisLockShutdownError(keys[0], this.parts.defaults.keyView);
    }
    return handles;
  }
}
