import type {
  Handoff,
  HandoffClaim,
  ReleaseSubscription,
} from '../interfaces/lock-backend.interface.js';
import { onAnyAbort } from '../utils/abort-listeners.js';

/** A waiter taken out of the queue to be handed the lock by a release in this process. */
export interface Heir {
  readonly claim: HandoffClaim;
  /**
   * Hands it the lock (Redis already did). If the caller stopped waiting meanwhile and ends
   * without holding the lock, `orphaned` is called to release it.
   */
  grant(handoff: Handoff, orphaned: () => void): void;
  /** The handoff did not happen: let it try by itself. */
  wake(): void;
}

export interface Waiter {
  /** Order of arrival of the caller (kept across its attempts): the queue's sort key. */
  readonly arrival: number;
  /** Its caller, which takes handoffs if it has a claim. */
  readonly subscription: ChannelSubscription;
  /** A release came: stop sleeping and try. */
  wake(): void;
  /** Now first in the queue: retry after a pause even if no release comes. */
  lead(): void;
  /** No longer first: sleep until woken, or until the caller's deadline. */
  follow(): void;
}

export interface ChannelState {
  refs: number;
  /**
   * How many of the callers watching take turns with other processes: a generated token's plain
   * lock (`claim`), whose failed attempts put this process in the key's queue of waiting
   * processes (see `JOIN_TURNS`). Readers, semaphores and a caller's own token never join it.
   */
  turnTakers: number;
  /** Releases seen on this channel since it was subscribed. */
  seen: number;
  /** Sleeping waiters in order of arrival: a release wakes the first; only the first polls. */
  waiters: Waiter[];
  /** Arrivals so far: numbers the callers watching this channel. */
  arrivals: number;
  /** When this process's turn began (its first handoff since a release that freed the lock). */
  turnStarted: number | undefined;
  /** This process freed the lock at the end of its turn: its release message waits. */
  yielding: boolean;
  /**
   * Such a release reached no other process (see `ReleaseNotifier.endYield`) before its message
   * came: the message wakes the first waiter at once, whichever process it names.
   */
  alone: boolean;
  /** The held-back wake-up of the first waiter. */
  deferred: NodeJS.Timeout | undefined;
  /** The last release message: one release announced on several Redlock nodes counts once. */
  lastMessage: string;
  ready: Promise<void>;
}

/** A channel nobody has waited on yet; `ready` settles once it is subscribed to. */
export const newChannelState = (ready: Promise<void>): ChannelState => ({
  refs: 0,
  turnTakers: 0,
  seen: 0,
  waiters: [],
  arrivals: 0,
  turnStarted: undefined,
  yielding: false,
  alone: false,
  deferred: undefined,
  lastMessage: '',
  ready,
});

interface WaitInProgress {
  readonly waiter: Waiter;
  /** Ends the wait with `outcome`; false if it had already ended. */
  end(outcome: Handoff | undefined): boolean;
  /** Taken out of the queue as an heir: waits for its handoff until its deadline only. */
  reserved(): void;
}

/**
 * One caller's view of a channel, across all its waits. As an heir (see `takeHeir`) it takes the
 * lock from a release: during the wait it is in, or, if that wait ended first (deadline, abort),
 * at its next wait; if the caller ends without holding the lock, the orphaned lock is released.
 */
export class ChannelSubscription implements ReleaseSubscription, Partial<Heir> {
  private woken = false;
  private disposed = false;
  private acquired = false;
  private readonly arrival: number;
  private current: WaitInProgress | undefined;
  /** A handoff that came while no wait was in progress. */
  private pending: { handoff: Handoff; orphaned: () => void } | undefined;

  constructor(
    private readonly state: ChannelState,
    readonly claim: HandoffClaim | undefined,
    private readonly onDispose: () => void,
  ) {
    this.arrival = state.arrivals++;
  }

  get ready(): Promise<void> {
    return this.state.ready;
  }

  get seen(): number {
    return this.state.seen;
  }

  wait(
    seen: number,
    pause: number,
    limit: number,
    signals: readonly (AbortSignal | undefined)[],
  ): Promise<Handoff | undefined> {
    this.woken = false;
    if (this.pending) {
      const { handoff } = this.pending;
      this.pending = undefined;
      return Promise.resolve(handoff);
    }
    if (this.state.seen !== seen) return Promise.resolve(undefined);
    const aborted = signals.find((signal) => signal?.aborted);
    if (aborted) return Promise.reject(aborted.reason as Error);
    const { waiters } = this.state;
    const until = performance.now() + limit;
    return new Promise<Handoff | undefined>((resolve, reject) => {
      let timer: NodeJS.Timeout | undefined;
      const sleep = (ms: number): void => {
        clearTimeout(timer);
        timer = setTimeout(() => current.end(undefined), Math.max(0, ms));
      };
      const waiter: Waiter = {
        arrival: this.arrival,
        subscription: this,
        wake: () => {
          if (current.end(undefined)) this.woken = true;
        },
        lead: () => sleep(Math.min(pause, until - performance.now())),
        follow: () => sleep(until - performance.now()),
      };
      const finish = (): boolean => {
        if (this.current !== current) return false;
        this.current = undefined;
        clearTimeout(timer);
        stopWatching();
        this.dequeue(waiter);
        return true;
      };
      const current: WaitInProgress = {
        waiter,
        end: (outcome) => finish() && (resolve(outcome), true),
        reserved: () => sleep(until - performance.now()),
      };
      this.current = current;
      const stopWatching = onAnyAbort(signals, (reason) => {
        if (finish()) reject(reason);
      });
      // Back in the queue after a failed attempt: in its place by arrival, not at the end.
      let at = waiters.length;
      while (at > 0 && waiters[at - 1].arrival > this.arrival) at--;
      waiters.splice(at, 0, waiter);
      if (at > 0) return waiter.follow();
      waiters[1]?.follow();
      waiter.lead();
    });
  }

  passOnWake(): void {
    if (!this.woken) return;
    this.woken = false;
    this.state.waiters[0]?.wake();
  }

  /** Heir: leaves the queue (the next waiter leads) and waits for its handoff. */
  reserve(): void {
    const current = this.current!;
    this.dequeue(current.waiter);
    current.reserved();
  }

  /** Heir: the lock is ours. */
  grant(handoff: Handoff, orphaned: () => void): void {
    if (this.current?.end(handoff)) return;
    if (!this.disposed) this.pending = { handoff, orphaned };
    else if (!this.acquired) orphaned();
  }

  /** Heir: the handoff did not happen. */
  wake(): void {
    this.current?.waiter.wake();
  }

  dispose(acquired: boolean, shared = false): void {
    if (this.disposed) return;
    this.disposed = true;
    this.acquired = acquired;
    // Handed the lock after its wait ended, and leaving without it: give it back.
    if (this.pending && !acquired) this.pending.orphaned();
    this.pending = undefined;
    // Woken by a release but leaving without having used it, or in with a lock the next waiter
    // may share (readers queued behind a writer): wake the next waiter.
    if ((this.woken && !acquired) || (acquired && shared)) this.state.waiters[0]?.wake();
    this.onDispose();
  }

  private dequeue(waiter: Waiter): void {
    const { waiters } = this.state;
    const index = waiters.indexOf(waiter);
    if (index < 0) return;
    waiters.splice(index, 1);
    if (index === 0) waiters[0]?.lead();
  }
}
