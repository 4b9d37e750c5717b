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

/** A lock handed straight to a waiter by the holder's release, without it being free in between. */
export interface Handoff {
  fence: number;
  /** How long the lock is known to be valid, counted from `sentAt`, in ms. */
  validity: number;
  /** When the release that handed it over was sent (`performance.now()`). */
  sentAt: number;
}

/** What a waiter needs to be handed a lock directly: the token and TTL it would acquire with. */
export interface HandoffClaim {
  token: string;
  ttl: number;
}

/**
 * Where locks live. The lock service drives acquire / watch / release through this interface
 * only, whatever the topology behind it.
 */
export interface LockBackend {
  /**
   * Longest any one call may take, in ms, before the lock service gives up on it: the module's
   * `commandTimeout`, or, in Redlock mode, the two rounds of an acquisition.
   */
  readonly replyTimeout: number;
  /**
   * How long a lock taken or extended with `ttl` is known to be valid, counted from when the
   * command was sent: `ttl`, less the clock drift allowed for in Redlock mode.
   */
  validity(ttl: number): number;
  tryAcquire(key: string, token: string, ttl: number): Promise<AcquireAttempt>;
  /** Resets the TTL. Resolves false when the token no longer holds the key. */
  extend(key: string, token: string, ttl: number): Promise<boolean>;
  /**
   * Gives the lock up: to the first waiter of this process if it takes handoffs (see
   * `watchReleases`), otherwise deletes it and wakes waiters. Resolves false when the token no
   * longer held the key.
   */
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
  /**
   * Subscribes to releases of `key`; dispose the subscription when done waiting. With a `claim`,
   * a release in this process may hand the lock straight to this waiter (see `wait`).
   */
  watchReleases(key: string, claim?: HandoffClaim): ReleaseSubscription;
  /**
   * Makes the choices that need the server (on Cluster: how releases are announced) when the app
   * starts, bounded by `commandTimeout`. Never rejects: what cannot be decided yet is decided on
   * first use.
   */
  prepare(): Promise<void>;
  /** Whether Redis answers (PING), with details for a health check. Never rejects. */
  health(): Promise<BackendHealth>;
  /** Closes the connections this backend owns; never a client the user passed in. */
  close(): Promise<void>;
}

/** What `LockBackend.health()` found. */
export interface BackendHealth {
  up: boolean;
  /** Shown in the health check's output: latency, or the error; per node in Redlock mode. */
  details: Record<string, unknown>;
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
   * pass in any case. Resolves with the `Handoff` when a release in this process handed the lock
   * to this waiter (it holds it then), otherwise with `undefined` (try again). Rejects with the
   * signal's reason when one of `signals` aborts.
   */
  wait(
    seen: number,
    pause: number,
    limit: number,
    signals: readonly (AbortSignal | undefined)[],
  ): Promise<Handoff | undefined>;
  /**
   * Stops watching. `acquired: false` means the waiter gave up: a wake-up it received but did not
   * use is handed to the next waiter.
   */
  dispose(acquired: boolean): void;
}
