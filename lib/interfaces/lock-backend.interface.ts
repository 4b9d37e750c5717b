/** The outcome of one acquisition attempt. */
export type AcquireAttempt =
  | {
      acquired: true;
      /** Fencing token of this holder. */
      fence: number;
      /**
       * The last fence of the block this grant reserved (see `HeldLease.fenceLimit`); `fence` when
       * it reserved none.
       */
      fenceLimit?: number;
      /** How long the lock is known to be valid, counted from when the attempt was sent, in ms. */
      validity: number;
      /**
       * Redlock mode, a caller's own token on one node: whether the token held the lock there with
       * its fence recorded (the fence it was granted before), rather than a new fence.
       */
      renewed?: boolean;
      /**
       * With `renewed`: whether that recorded fence is the holder's (raised to it by the second
       * round, or written back with a copy), not only the fence this node counted at its grant.
       */
      settled?: boolean;
    }
  | {
      acquired: false;
      /** How long the current holder's lock still lives, in ms; undefined if unknown or no TTL. */
      retryAfter: number | undefined;
      /**
       * Whether another holder had the key. False when it was not taken for another reason: a fair
       * waiter whose turn it is not, a grant whose reply came after its lease had run out.
       */
      held: boolean;
      /** Redlock mode, one node's refusal: the token that holds the key there. */
      holder?: string;
      /**
       * Redlock mode: refused by a split vote (no holder has a majority): worth trying again soon
       * (see `RedlockBackend.splitVote`).
       */
      split?: boolean;
    };

/** What a holder takes on a key. */
export interface LockShape {
  /** 1: exclusive (the plain lock; a writer); more: a place in a counting semaphore. */
  readonly limit: number;
  /** 'read': shared with other readers, excluding writers (`limit` is then 1). */
  readonly mode: 'write' | 'read';
  /** An exclusive lock granted in arrival order across processes (`limit` 1, `mode` 'write'). */
  readonly fair: boolean;
}

/** A lock handed straight to a waiter by the holder's release, without it being free in between. */
export interface Handoff {
  fence: number;
  /** See `HeldLease.fenceLimit`. */
  fenceLimit: number;
  /** How long the lock is known to be valid, counted from `sentAt`, in ms. */
  validity: number;
  /** When the release that handed it over was sent (`performance.now()`). */
  sentAt: number;
  /**
   * Set when the heir was handed the lock before Redis knew (see `HeldLease`): the write of its
   * token and TTL, in flight.
   */
  swap?: PendingSwap;
  /**
   * With `swap`: when Redis last confirmed the lease the heir continues (see
   * `HeldLease.confirmedAt`). Otherwise the handoff itself confirmed it, at `sentAt`.
   */
  confirmedAt?: number;
}

/**
 * The write of an heir's token and TTL over its predecessor's, sent after the heir started.
 * Resolves with when it was sent (`performance.now()`) once the heir's token holds the lock with
 * its TTL, or `undefined` if the lock was no longer its predecessor's (the heir has lost it).
 */
export type PendingSwap = Promise<number | undefined>;

/**
 * What a release needs to know about the lease it ends, to pass the lock on to a waiter of this
 * process without a round trip to Redis: the heir starts at once with the next fence of the
 * block its predecessor's grant reserved in Redis, on its predecessor's lease, while the write of
 * its own token and TTL goes out behind it (`PendingSwap`).
 */
export interface HeldLease {
  readonly fence: number;
  /**
   * The last fence reserved for this lease's line of heirs: a grant from Redis to a generated
   * token reserves a block of fences (see `FENCE_STRIDE`); a lease handed on in the process takes
   * the next one. Equal to `fence` when nothing is left to hand on.
   */
  readonly fenceLimit: number;
  /** When the lease runs out unless extended (`performance.now()`). */
  readonly expiresAt: number;
  /** Set if the lease ended early (lost, or abandoned on shutdown): then it is not handed on. */
  readonly lossReason: unknown;
  /**
   * When the command that Redis last confirmed this lease with was sent (`performance.now()`): its
   * grant or its latest extension, or, for a lease passed on before Redis knew, its predecessor's.
   * A lease confirmed before the connection was last lost is not passed on without asking Redis
   * (Redis may have failed over or restarted meanwhile; see `passable`).
   */
  readonly confirmedAt: number;
  /** This lease's own token write, if it was itself handed on and Redis has not answered yet. */
  readonly swap?: PendingSwap;
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
  /** A command's failure in words a user can act on (which Redis, and why), else as it is. */
  explain?(error: unknown): unknown;
  /** While the connection is down: which Redis, and why (for a reply that never came). */
  unreachable?(): string | undefined;
  /**
   * How long a lock taken or extended with `ttl` is known to be valid, counted from when the
   * command was sent: `ttl`, less the clock drift allowed for in Redlock mode.
   */
  validity(ttl: number): number;
  /** Whether it offers shapes besides the plain lock (semaphores, read locks); Redlock mode does not. */
  readonly shapes: boolean;
  /**
   * One attempt at `shape` (default: the plain lock). Every method below takes the shape the lock
   * was acquired with.
   */
  tryAcquire(
    key: string,
    token: string,
    ttl: number,
    shape?: LockShape,
    /**
     * Whether the caller will wait if this attempt fails: a fair lock then joins the queue, a
     * writer marks itself waiting for readers. False: one attempt that leaves nothing behind.
     */
    queue?: boolean,
    /**
     * Whether the token is one this library generated (not the caller's own): a plain lock then
     * reserves a block of fences for the holder's in-process heirs (see `HeldLease.fenceLimit`).
     */
    reserve?: boolean,
  ): Promise<AcquireAttempt>;
  /**
   * One attempt at plain locks on several keys in one step, all or none, with a fresh token:
   * resolves their fences in `keys` order, or how long the first taken key still lives (like a
   * failed attempt's `retryAfter`; undefined if unknown). Undefined where one step cannot do it
   * (a Cluster, whose keys live on several nodes; Redlock; `replicaAck`).
   */
  tryAcquireAll(
    keys: readonly string[],
    token: string,
    ttl: number,
  ): Promise<number[] | { retryAfter: number | undefined }> | undefined;
  /**
   * A waiter that gives up without the lock leaves nothing behind: a fair waiter leaves the queue
   * of `key`, waking the next in line; a writer takes back its mark on read locks (another waiting
   * writer renews its own at its next attempt).
   */
  giveUp(key: string, token: string, shape: LockShape): Promise<void>;
  /**
   * Resets the TTL. Resolves false when the token no longer holds the key. `fence`: the holder's
   * (Redlock mode records it with a copy it writes back).
   */
  extend(
    key: string,
    token: string,
    ttl: number,
    shape?: LockShape,
    fence?: number,
  ): Promise<boolean>;
  /**
   * Gives the lock up: to the first waiter of this process if it takes handoffs (see
   * `watchReleases`; only a plain lock), otherwise deletes it and wakes waiters. Resolves
   * false when the token no longer held the key. `lease`: the holder's, when it has one (see
   * `HeldLease`); the release is sent only after the lease's own pending swap. `keep` (ms, with
   * `holdAtLeast`): the key's TTL is shortened to that instead (owner-checked, as an extension:
   * nothing deleted, announced or passed on), and its process still leaves the key's queue of
   * waiting processes if none of its callers waits.
   */
  release(
    key: string,
    token: string,
    shape?: LockShape,
    lease?: HeldLease,
    keep?: number,
  ): Promise<boolean>;
  isLocked(key: string): Promise<boolean>;
  /** Whether `token` still holds `key`, whatever the shape. Changes nothing. */
  isHeld(key: string, token: string): Promise<boolean>;
  /**
   * A term of the leadership of `key` began, held by `token`: records who leads (see
   * `election.scripts.ts`). Nothing is written if `token` no longer holds the lock.
   */
  recordTerm(key: string, token: string, id: string, fence: number, ttl: number): Promise<void>;
  /**
   * A campaign for `key` stays listed among its participants for `stay` more ms (0: it stopped);
   * `entry` is its own (`<random>:<id>`: two campaigns may share an id).
   */
  participate(key: string, entry: string, stay: number): Promise<void>;
  /** The election of `key`: who leads (null: nobody), and with `participants`, who campaigns. */
  election(key: string, participants: boolean): Promise<Election>;
  /** What holds `key` now (see `inspect.scripts.ts`). Changes nothing. */
  inspect(key: string): Promise<Inspection>;
  /**
   * Frees `key` whatever holds it, for an operator (see `FORCE_RELEASE_SCRIPT`): what it freed
   * (no holders: it was free).
   */
  forceRelease(key: string): Promise<Freed>;
  /**
   * Calls `listener` each time the connection comes back after it was lost (not on the first
   * connection). Returns a function that removes the listener.
   */
  onReconnect(listener: () => void): () => void;
  /** Whether callers in this process already wait for `key` (hold a subscription to it). */
  hasWaiters(key: string): boolean;
  /**
   * Whether callers in this process that take turns with other processes wait for `key` (a plain
   * lock's waiters with a token of the library's making: see `watchReleases`' claim): they keep
   * the process's place in the key's queue of waiting processes.
   */
  takesTurns(key: string): boolean;
  /**
   * Subscribes to releases of `key`; dispose the subscription when done waiting. With a `claim`,
   * a release in this process may hand the lock straight to this waiter (see `wait`). With
   * `turnOf` (a fair waiter's token), to the news that it is that waiter's turn instead.
   */
  watchReleases(key: string, claim?: HandoffClaim, turnOf?: string): ReleaseSubscription;
  /**
   * Makes the choices that need the server (on Cluster: how releases are announced) when the app
   * starts, bounded by `commandTimeout`. Never rejects: what cannot be decided yet is decided on
   * first use.
   */
  prepare(): Promise<void>;
  /** Whether Redis answers (PING), with details for a health check. Never rejects. */
  health(): Promise<BackendHealth>;
  /**
   * Closes the connections this backend owns (never a client the user passed in), by `deadline`
   * (`performance.now()`; none: within `commandTimeout`): first the writes it still has in flight
   * (releases, hand-overs and what they orphaned), then QUIT, or a hard disconnect once the
   * deadline has passed.
   */
  close(deadline?: number): Promise<void>;
}

/** What `LockBackend.election()` read (times on Redis's clock, ms since the epoch). */
export interface Election {
  leader: { id: string; fence: number; since: number; renewedAt: number } | null;
  /** How many terms began since the record was created. */
  transitions: number;
  /** The ids campaigning, when asked for (else empty). */
  participants: string[];
}

/** What `LockBackend.inspect()` read; `token` is compared between nodes, never shown. */
export interface Inspection {
  mode: 'exclusive' | 'semaphore' | 'read' | null;
  holders: number;
  ttlLeft: number;
  fence: number | null;
  waiting: number;
  token: string;
}

/**
 * What `LockBackend.forceRelease()` freed: the shape that held the key and how many held it, and
 * the force's own fence (above every freed holder's, below every later holder's).
 */
export interface Freed {
  mode: Inspection['mode'];
  holders: number;
  fence: number;
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
   * After an attempt that failed: if a release woke this waiter and it could not use it, the next
   * waiter is woken to try. For shapes whose callers differ in what they can take (places of
   * semaphores with different limits, readers and writers): what one could not take, the next may.
   */
  passOnWake(): void;
  /**
   * Stops watching. `acquired: false` means the waiter gave up: a wake-up it received but did not
   * use is handed to the next waiter. `shared`: it took a lock others may share (a read lock), so
   * the next waiter is woken to try too.
   */
  dispose(acquired: boolean, shared?: boolean): void;
}
