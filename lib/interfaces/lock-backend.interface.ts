/** The outcome of one acquisition attempt. */
export type AcquireAttempt =
  | {
      acquired: true;
      /** Fencing token of this holder. */
      fence: number;
      /** How long the lock is known to be valid, counted from when the attempt was sent, in ms. */
      validity: number;
    }
  | {
      acquired: false;
      /** How long the current holder's lock still lives, in ms; undefined if unknown or no TTL. */
      retryAfter: number | undefined;
    };

/**
 * Where locks live. The lock service drives acquire / watch / release through this interface
 * only, whatever the topology behind it.
 */
export interface LockBackend {
  tryAcquire(key: string, token: string, ttl: number): Promise<AcquireAttempt>;
  /** Resets the TTL. Resolves false when the token no longer holds the key. */
  extend(key: string, token: string, ttl: number): Promise<boolean>;
  /** Deletes the lock and wakes waiters. Resolves false when the token no longer held the key. */
  release(key: string, token: string): Promise<boolean>;
  isLocked(key: string): Promise<boolean>;
  /** Whether `token` still holds `key`. Changes nothing. */
  isHeld(key: string, token: string): Promise<boolean>;
  /**
   * Calls `listener` each time the connection comes back after it was lost (not on the first
   * connection). Returns a function that removes the listener.
   */
  onReconnect(listener: () => void): () => void;
  /** Whether callers in this process already wait for `key` (hold a subscription to it). */
  hasWaiters(key: string): boolean;
  /** Subscribes to releases of `key`; dispose the subscription when done waiting. */
  watchReleases(key: string): ReleaseSubscription;
  /** Closes the connections this backend owns; never a client the user passed in. */
  close(): Promise<void>;
}

/** A waiter's view of the release announcements of one key. */
export interface ReleaseSubscription {
  /** Settles once the subscription is active (or has failed; waits then fall back to timers). */
  readonly ready: Promise<void>;
  /** Count of releases seen so far; pass it to `wait()` so a release in between is not missed. */
  readonly seen: number;
  /**
   * Sleeps in this process's queue of waiters for the key until a release newer than `seen` wakes
   * it (the first in the queue is woken first), or, if it is first, `pause` ms pass, or `limit` ms
   * pass in any case. Rejects with the signal's reason when one of `signals` aborts.
   */
  wait(
    seen: number,
    pause: number,
    limit: number,
    signals: readonly (AbortSignal | undefined)[],
  ): Promise<void>;
  /**
   * Stops watching. `acquired: false` means the waiter gave up: a wake-up it received but did not
   * use is handed to the next waiter.
   */
  dispose(acquired: boolean): void;
}
