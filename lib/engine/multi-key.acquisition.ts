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
 * later key also ends early enough for its reply to land inside their leases (`keyWaitEnd`), and
 * the lock is only returned if every key's lease is still running. Any failure releases what was
 * taken; when Redis fails, without waiting for those releases (they are bounded and logged).
 */
export class MultiKeyAcquisition {
  constructor(
    private readonly parts: EngineParts,
    private readonly loop: AcquireLoop,
    /** Releases a lock after no work ran, logging what cannot be released. */
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
    const handles: KeyHold[] = [];
    try {
      // Free keys in one step where it can be done (not when the chain re-enters some of them).
      if (
        opts.shape === PLAIN &&
        opts.token === undefined &&
        !keys.some((key) => findChainLock(this.parts.hooks, key))
      ) {
        handles.push(...(await this.attemptAll(keys, token, opts, started)));
      }
      for (const key of keys.slice(handles.length)) {
        const until = opts.autoExtend
          ? started + opts.acquireTimeout
          : Math.min(started + opts.acquireTimeout, this.keyWaitEnd(handles));
        const acquireTimeout = Math.max(0, Math.ceil(until - performance.now()));
        const handle = await this.loop.obtain(key, given, mode, { ...opts, acquireTimeout }, token);
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
    return earliest - Math.min(this.parts.commandTimeout, left / 2);
  }

  /** Undoes a partial acquisition (no work ran: a lease that ran out is no news). */
  private async releaseAll(handles: readonly KeyHold[]): Promise<void> {
    await Promise.all(handles.map((handle) => this.undo(handle)));
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
      fences = await replies.reply(keys[0], 'acquire', pending, opts.signal, true);
    } catch (error) {
      replies.undoLateGrant(error, pending, (late) =>
        Array.isArray(late)
          ? Promise.all(keys.map((key) => backend.release(key, token)))
          : undefined,
      );
      throw error;
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
      await Promise.all(handles.map((handle) => handle.abandon().catch(() => false)));
      throw new RedisLockShutdownError(keys[0]);
    }
    return handles;
  }
}
