/**
 * A held lock. Returned by `LockService.acquire()` / `tryAcquire()` and passed to the
 * callback of `using()`.
 */
export interface Lock {
  /** The key as the caller gave it, without the module's `keyPrefix`. */
  readonly key: string;
  /** The owner token stored in Redis: 128 random bits, or the caller's own `token`. */
  readonly token: string;
  /**
   * Fencing token: greater than the fence of every earlier holder of this key. Send it with
   * every write to the protected resource and have the resource reject a fence lower than the
   * highest it has seen; that stops a holder that lost the lock without knowing it.
   */
  readonly fence: number;
  /**
   * When the lock runs out unless it is extended, as a local monotonic estimate on the
   * `performance.now()` clock (ms). Conservative: measured from before the acquiring command
   * was sent, so Redis expires the key no earlier than this.
   */
  readonly expiresAt: number;
  /**
   * Aborts, with a `LockLostError` as its `reason`, as soon as the lock is known or suspected
   * lost: an extension found another owner, no extension was confirmed before the TTL ran out,
   * the TTL ran out with auto-extension off, or a check after a reconnection found the lock gone.
   * Never aborts because of `release()` itself; but a release that comes after the lease ran out
   * unnoticed (the event loop was frozen or blocked past the expiry) aborts it first.
   */
  readonly signal: AbortSignal;
  /** Releases the lock. Resolves `false` if it was no longer ours. Never throws for that. */
  release(): Promise<boolean>;
  /**
   * Resets the lock's TTL to `ttl` (default: the TTL it was acquired with).
   * @throws LockLostError if the lock is no longer ours.
   */
  extend(ttl?: number): Promise<void>;
}

/** Per-call options of `acquire()`, `tryAcquire()` and `using()`. Unset fields take the module's `defaults`. */
export interface AcquireOptions {
  /**
   * How long Redis keeps the lock if it is not extended or released, in ms.
   * @default 10_000 (or the module's `defaults.ttl`)
   */
  ttl?: number;
  /**
   * How long to wait for a lock held by someone else, in ms. `0` makes one attempt.
   * Checked, but not used, by `tryAcquire()`, which never waits.
   * @default 5_000 (or the module's `defaults.acquireTimeout`)
   */
  acquireTimeout?: number;
  /**
   * Extend the lock in the background, when a third of its lease has passed (every `ttl / 3`),
   * for as long as it is held.
   * @default false for acquire() / tryAcquire(), true for using() and @WithLock
   */
  autoExtend?: boolean;
  /** Cancels the wait: the call rejects with `LockAcquireAbortedError`. Has no effect once the lock is held. */
  signal?: AbortSignal;
  /**
   * Use this owner token instead of a fresh random one. Acquiring with the token that already
   * holds the key succeeds (and resets its TTL), so a retry after a lost reply never locks out
   * its own caller. Keep it secret and unique per holder.
   */
  token?: string;
}
