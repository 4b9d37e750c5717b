/**
 * A held lock. Returned by `LockService.acquire()` / `tryAcquire()` and passed to the
 * callback of `using()`.
 */
export interface Lock {
  /**
   * The key as the caller gave it, without the module's `keyPrefix`. A lock on several keys:
   * the first of `keys`.
   */
  readonly key: string;
  /**
   * Every key this lock holds, in the order they were locked (sorted by UTF-16 code units, the
   * one order every caller uses). One key: `[key]`.
   */
  readonly keys: readonly string[];
  /** The owner token stored in Redis: 128 random bits, or the caller's own `token`. */
  readonly token: string;
  /**
   * Fencing token: greater than the fence of every earlier holder of this key. Send it with
   * every write to the protected resource and have the resource reject a fence lower than the
   * highest it has seen; that stops a holder that lost the lock without knowing it. A lock on
   * several keys: the fence of `key` (the first key); each key's own is in `fences`.
   */
  readonly fence: number;
  /**
   * The fence of each key (`fences[key]`): each grows per key, independently of the others.
   * One key: `{ [key]: fence }`.
   */
  readonly fences: Readonly<Record<string, number>>;
  /**
   * When the lock runs out unless it is extended, as a local monotonic estimate on the
   * `performance.now()` clock (ms). Conservative: the TTL less 1 % and 2 ms, measured from before
   * the acquiring command was sent, so Redis expires the key no earlier than this. Several keys:
   * the earliest. A lease that runs out unconfirmed aborts `signal` at this time, never before.
   */
  readonly expiresAt: number;
  /**
   * Aborts, with a `LockLostError` as its `reason`, as soon as the lock is known or suspected
   * lost: an extension found another owner, no extension was confirmed before the TTL ran out,
   * the TTL ran out with auto-extension off, or a check after a reconnection found the lock gone.
   * Never aborts because of `release()` itself; but a release that comes after the lease ran out
   * unnoticed (the event loop was frozen or blocked past the expiry) aborts it first. A re-entry
   * (a view of a lock held further up the call chain) has a signal of its own, which also aborts
   * (reason `released`) when that hold ends while the view is still open.
   */
  readonly signal: AbortSignal;
  /**
   * Releases the lock (several keys: every one of them). Resolves `false` if it (any of them) was
   * no longer ours. Never throws for that.
   */
  release(): Promise<boolean>;
  /**
   * Resets the lock's TTL to `ttl` (default: the TTL it was acquired with); several keys: every
   * key's.
   * @throws LockLostError if the lock (any of its keys) is no longer ours.
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
   * @default `false` for `acquire()` / `tryAcquire()`, `true` for `using()` and `@WithLock`
   */
  autoExtend?: boolean;
  /** Cancels the wait: the call rejects with `LockAcquireAbortedError`. Has no effect once the lock is held. */
  signal?: AbortSignal;
  /**
   * A counting semaphore: at most `limit` holders of the key at once, across processes, each with
   * its own token, lease, fence and `signal`. `1` is the plain (exclusive) lock. A plain lock and a
   * semaphore on the same key exclude each other entirely; callers that give one key different
   * limits are each admitted while fewer than their own limit hold it. Not in Redlock mode.
   * @default 1
   */
  limit?: number;
  /**
   * `'read'`: a read lock, shared with every other reader of the key and excluding writers;
   * `'write'`: exclusive (the plain lock is a writer). A writer that waits holds new readers off
   * (writer preference), so a stream of readers cannot starve it. Not with `limit`, not in Redlock
   * mode.
   * @default 'write'
   */
  mode?: 'write' | 'read';
  /**
   * FIFO across processes: waiters get the key in the order they first asked for it, and a
   * newcomer never takes a free key ahead of the queue (among callers that ask for `fair`). A
   * waiter that gives up leaves the queue; one that dies is dropped within a few retry intervals.
   * Exclusive locks only (not with `limit` or `mode: 'read'`), not in Redlock mode.
   * @default false
   */
  fair?: boolean;
  /**
   * Use this owner token instead of a fresh random one. Acquiring with the token that already
   * holds the key succeeds, with the same fence, and lengthens its TTL to at least `ttl` (never
   * shortens it: a handle taken earlier with a longer TTL keeps its lease), so a retry after a
   * lost reply never locks out its own caller. Keep it secret and unique per holder.
   */
  token?: string;
  /**
   * Keep the key taken at least this long (ms, at most `ttl`) after the lock was granted, even if
   * it is released sooner: an earlier release shortens the key's TTL to what remains instead of
   * deleting it (owner-checked, in Redis; no timer is left in the process), and nobody, in this
   * process or another, gets the key before then. For jobs that must run once per fire across
   * instances whose timers fire a little apart. Plain (exclusive, not `fair`) locks only.
   * @default 0
   */
  holdAtLeast?: number;
}

/**
 * What holds a lock now, for an operator (`LockService.inspect()`): read in one step, a hint that
 * may change at once.
 */
export interface LockInspection {
  /** Whether anyone holds the lock. */
  held: boolean;
  /**
   * What holds it: `exclusive` (a plain lock, a fair lock or a writer), `semaphore` (places of a
   * counting semaphore), `read` (read locks); `null` when free.
   */
  mode: 'exclusive' | 'semaphore' | 'read' | null;
  /** How many hold it: 1 for an exclusive lock, the places taken, the readers. */
  holders: number;
  /** Ms until the lock runs out unless extended (the last holder's, for shared shapes); 0 when free. */
  ttlLeft: number;
  /**
   * The holder's fence where Redis records it: an exclusive lock taken with your own `token`.
   * `null` otherwise: a generated token's fence is not stored in Redis (its holder has it), nor is
   * each reader's or place's.
   */
  fence: number | null;
  /**
   * Who waits, where Redis knows it: the processes queued for a plain lock (one per process,
   * however many of its callers wait), each waiter of a fair lock, and a writer waiting for
   * readers to leave. Callers waiting with their own token, for a semaphore's place, or as readers
   * behind a writer listen for releases without queueing, and are not counted. A semaphore's
   * `limit` is not stored in Redis either: each caller passes its own.
   */
  waiting: number;
}

/** What `LockService.forceRelease()` freed. */
export interface ForcedRelease {
  /** The shape that held the key (see `LockInspection.mode`); `null` when it was free. */
  mode: 'exclusive' | 'semaphore' | 'read' | null;
  /** How many held it and were freed: 1 for an exclusive lock, the places, the readers; 0: free. */
  holders: number;
  /**
   * The force's own fence: above the fence of every holder it freed (and of every lock such a
   * holder passes on in its process before it learns), below every later holder's. Tell your
   * fenced store to refuse writes at or below it, and no freed holder's write lands.
   */
  fence: number;
}
