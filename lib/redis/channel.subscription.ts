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
  /**
   * Every caller watching, asleep or not, in order of arrival: a release that surely holds the
   * lock hands it to the first of them still in line, also one whose attempt is on its way (see
   * `firstInLine`).
   */
  callers: ChannelSubscription[];
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
  callers: [],
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
  /** Taken as an heir (see `reserve`): its handoff, or word that it did not happen, is coming. */
  private handoffComing = false;

  constructor(
    private readonly state: ChannelState,
    readonly claim: HandoffClaim | undefined,
    private readonly onDispose: () => void,
  ) {
    this.arrival = state.arrivals++;
    state.callers.push(this);
  }

  /** Waiting, and neither handed a lock nor about to be. */
  get inLine(): boolean {
    return !this.disposed && !this.handoffComing && this.pending === undefined;
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
      // Taken as an heir while its attempt was on its way: out of the queue, the handoff coming.
      if (this.handoffComing) return current.reserved();
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

  /**
   * Heir: leaves the queue (the next waiter leads) and waits for its handoff; one whose attempt
   * is on its way waits for it in its next wait (see `wait`).
   */
  reserve(): void {
    this.handoffComing = true;
    const current = this.current;
    if (!current) return;
    this.dequeue(current.waiter);
    current.reserved();
  }

  /** Heir: the lock is ours. */
  grant(handoff: Handoff, orphaned: () => void): void {
    this.handoffComing = false;
    if (this.current?.end(handoff)) return;
    if (!this.disposed) this.pending = { handoff, orphaned };
    else if (!this.acquired) orphaned();
  }

  /** Heir: the handoff did not happen. */
  wake(): void {
    this.handoffComing = false;
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
    const { callers } = this.state;
    callers.splice(callers.indexOf(this), 1);
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

/**
 * The caller a release of the key hands the lock to: the first sleeping waiter, or, when the
 * release surely holds the lock (`holding`: its lease is live, so no attempt of another caller can
 * have succeeded), the first caller in line by arrival, also one whose attempt is on its way (it
 * takes the handoff at its next wait): without it, a first waiter that was retrying as the lock
 * was released lost its place to the second.
 */
export function firstInLine(
  state: ChannelState,
  holding: boolean,
): ChannelSubscription | undefined {
  if (!holding) return state.waiters[0]?.subscription;
  return state.callers.find((caller) => caller.inLine);
}

/**
 * Takes the heir of a release out of the line (see `firstInLine`), or none: nobody waits, the
 * first in line takes no handoffs, or this process's turn (`turn` ms from its first handoff, the
 * module's `handoffTurn`) is over. In that last case the release frees the lock and this process
 * yields it (`state.yielding`, see `ReleaseNotifier.takeHeir`).
 */
export function takeHeir(state: ChannelState, holding: boolean, turn: number): Heir | undefined {
  const heir = firstInLine(state, holding);
  const now = performance.now();
  const turnOver =
    turn === 0 || (state.turnStarted !== undefined && now - state.turnStarted >= turn);
  if (!heir?.claim || turnOver) {
    state.yielding = heir !== undefined && turnOver;
    state.turnStarted = undefined;
    return undefined;
  }
  state.turnStarted ??= now;
  heir.reserve();
  return heir as Heir;
}

/**
 * A release was announced on `state`'s channel: its first waiter tries, at once, or `holdBack` ms
 * later when this process yields the lock (see `takeHeir`).
 */
export function announced(state: ChannelState, holdBack: number): void {
  state.seen++;
  if (!state.yielding) return void state.waiters[0]?.wake();
  state.yielding = false;
  clearTimeout(state.deferred);
  state.deferred = setTimeout(() => {
    state.deferred = undefined;
    state.waiters[0]?.wake();
  }, holdBack);
}

/**
 * The yielding release of `state`'s channel is done: if no other process heard it
 * (`othersWaiting` false), this process's first waiter tries now instead of holding back; if its
 * message has not come yet, it wakes that waiter at once when it does (`alone`).
 */
export function endYield(state: ChannelState, othersWaiting: boolean): void {
  if (othersWaiting) return;
  if (state.deferred) {
    clearTimeout(state.deferred);
    state.deferred = undefined;
    state.waiters[0]?.wake();
  } else if (state.yielding) {
    state.yielding = false;
    state.alone = true;
  }
}
