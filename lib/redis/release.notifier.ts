import { Logger } from '@nestjs/common';
import type { Cluster, Redis } from 'ioredis';
import type {
  Handoff,
  HandoffClaim,
  ReleaseSubscription,
} from '../interfaces/lock-backend.interface.js';
import { DEFAULT_HANDOFF_TURN } from '../redis-lock.options.js';
import { closeQuietly, watchConnection } from './connections.js';

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

const NOT_SHARDED = Promise.resolve(false);

/**
 * How long this process's waiters hold back after such a release when other processes wait too:
 * they would otherwise win the race for it (their process is already running, the others must be
 * woken), and the lock would never leave a busy process. Past it they try anyway, in case nobody
 * else took the lock.
 */
const YIELD_MS = 5;

interface Waiter {
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

interface ChannelState {
  refs: number;
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
  /** The held-back wake-up of the first waiter. */
  deferred: NodeJS.Timeout | undefined;
  /** The last release message: one release announced on several Redlock nodes counts once. */
  lastMessage: string;
  ready: Promise<void>;
}

/**
 * Wakes waiters when a lock is released. One subscriber connection per module and Redis node (a
 * `duplicate()` of each command client, created on first use); a channel per lock key,
 * subscribed while at least one waiter in this process wants it. In Redlock mode a release is
 * announced on every node with the same non-empty message, which wakes waiters once.
 *
 * The waiters of one key in one process form a queue in order of arrival. A release wakes the
 * first only: the others would lose the race anyway, and the winner's own release wakes the next.
 * Only the first also retries on a timer (every `retryInterval`), so a lost message costs time,
 * never a hang, and idle waiters cost one command per pause per process, not per waiter; the
 * others sleep until woken, promoted to first, or out of time. A waiter that is woken but gives up
 * before trying passes its wake-up on.
 */
export class ReleaseNotifier {
  private subscribers: (Redis | Cluster)[] | undefined;
  private readonly channels = new Map<string, ChannelState>();
  /** Whether releases are announced with SPUBLISH (Cluster, Redis 7): known once subscribed. */
  private sharded = false;

  constructor(
    /** The command clients: one, or one per Redlock node. */
    private readonly sources: readonly (Redis | Cluster)[],
    /** Longest wait for QUIT when closing the subscriber connection. */
    private readonly commandTimeout: number,
    private readonly logger: Logger,
    /** Resolves whether releases are announced on sharded channels (see `RedisLockBackend`). */
    private readonly shardedPubSub: () => Promise<boolean> = () => NOT_SHARDED,
    /** The module's `handoffTurn` (ms): how long this process may pass a lock among its own waiters. */
    private readonly turn = DEFAULT_HANDOFF_TURN,
  ) {}

  watch(channel: string, claim?: HandoffClaim): ReleaseSubscription {
    let state = this.channels.get(channel);
    if (!state) {
      state = {
        refs: 0,
        seen: 0,
        waiters: [],
        arrivals: 0,
        turnStarted: undefined,
        yielding: false,
        deferred: undefined,
        lastMessage: '',
        ready: this.subscribe(channel),
      };
      this.channels.set(channel, state);
    }
    state.refs++;
    return new ChannelSubscription(state, claim, () => this.unwatch(channel, state));
  }

  /** Whether any channel is watched at all (cheaper to ask first than `isWatched`). */
  get watching(): boolean {
    return this.channels.size > 0;
  }

  /**
   * Takes the first waiter of `channel` out of the queue so that a release can hand it the lock
   * directly, or returns undefined: nobody waits, the first waiter takes no handoffs, or this
   * process's turn (`handoffTurn` from its first handoff) is over. In that last case this release
   * frees the lock and this process yields it: its waiters hold back when the release message
   * comes, until `endYield()` says that no other process waits, or for `YIELD_MS`. Without the
   * turn, a busy process would pass a hot lock among its own workers for ever.
   */
  takeHeir(channel: string): Heir | undefined {
    const state = this.channels.get(channel);
    if (!state) return undefined;
    const heir = state.waiters[0]?.subscription;
    const now = performance.now();
    const turnOver =
      this.turn === 0 || (state.turnStarted !== undefined && now - state.turnStarted >= this.turn);
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
   * The yielding release of `channel` is done: if no other process got its message, this
   * process's first waiter tries now instead of holding back.
   */
  endYield(channel: string, othersWaiting: boolean): void {
    const state = this.channels.get(channel);
    if (!state || othersWaiting) return;
    state.yielding = false;
    if (state.deferred) {
      clearTimeout(state.deferred);
      state.deferred = undefined;
      state.waiters[0]?.wake();
    }
  }

  /** Whether callers in this process are already waiting on `channel`. */
  isWatched(channel: string): boolean {
    return this.channels.has(channel);
  }

  /** Closes the subscriber connection. Waiters still sleeping wake on their own timers or signals. */
  async close(): Promise<void> {
    const subscribers = this.subscribers ?? [];
    this.subscribers = undefined;
    for (const state of this.channels.values()) clearTimeout(state.deferred);
    this.channels.clear();
    await Promise.all(
      subscribers.map((subscriber) => closeQuietly(subscriber, this.commandTimeout)),
    );
  }

  private async subscribe(channel: string): Promise<void> {
    try {
      this.sharded = await this.shardedPubSub();
      const subscribers = (this.subscribers ??= this.sources.map((source) =>
        this.createSubscriber(source),
      ));
      await Promise.all(
        subscribers.map((subscriber) =>
          this.sharded ? subscriber.ssubscribe(channel) : subscriber.subscribe(channel),
        ),
      );
    } catch (error) {
      this.logger.warn(
        `Could not subscribe to lock releases on "${channel}"; waiters fall back to polling: ${String(error)}`,
      );
    }
  }

  private unwatch(channel: string, state: ChannelState): void {
    if (--state.refs > 0 || this.channels.get(channel) !== state) return;
    this.channels.delete(channel);
    clearTimeout(state.deferred);
    for (const subscriber of this.subscribers ?? []) {
      (this.sharded ? subscriber.sunsubscribe(channel) : subscriber.unsubscribe(channel)).catch(
        () => {
          // The connection is gone; there is nothing left to unsubscribe from.
        },
      );
    }
  }

  private createSubscriber(source: Redis | Cluster): Redis | Cluster {
    // A Cluster subscribes to a sharded channel on the node that owns its slot. A Cluster's
    // subscribers resubscribe after a reconnection by themselves, and handle what that answers.
    const subscriber = this.sharded
      ? (source as Cluster).duplicate(undefined, { shardedSubscribers: true })
      : (source as { isCluster?: boolean }).isCluster
        ? (source as Cluster).duplicate()
        : this.resubscribing((source as Redis).duplicate({ autoResubscribe: false }));
    subscriber.on(this.sharded ? 'smessage' : 'message', (channel: string, message: string) => {
      const state = this.channels.get(channel);
      if (!state) return;
      if (message !== '') {
        if (message === state.lastMessage) return;
        state.lastMessage = message;
      }
      state.seen++;
      if (!state.yielding) return void state.waiters[0]?.wake();
      state.yielding = false;
      clearTimeout(state.deferred);
      state.deferred = setTimeout(() => {
        state.deferred = undefined;
        state.waiters[0]?.wake();
      }, YIELD_MS);
    });
    watchConnection(subscriber, 'Lock release subscriber', this.logger);
    return subscriber;
  }

  /**
   * Subscribes `subscriber` (a `Redis`, created with `autoResubscribe: false`) to every watched
   * channel again each time it is ready after losing its connection. ioredis' own resubscription
   * sends SUBSCRIBE and drops the promise it gets: if the connection goes again before the reply
   * (a reset right after a reconnection; with `maxRetriesPerRequest: 0`, at once), that promise
   * rejects with nobody to handle it, an unhandled rejection in the app (seen in the chaos suite).
   * Here a failed resubscription is dropped: the connection was lost again, and the next `ready`
   * resubscribes; meanwhile the first waiter of each key polls.
   */
  private resubscribing(subscriber: Redis): Redis {
    let dropped = false;
    subscriber.on('close', () => void (dropped = true));
    subscriber.on('ready', () => {
      if (!dropped) return;
      dropped = false;
      const channels = [...this.channels.keys()];
      if (channels.length === 0) return;
      subscriber.subscribe(...channels).catch(() => {
        // Lost again before the reply: see above.
      });
    });
    return subscriber;
  }
}

/** A wait in progress: its place in the queue and how to end it. */
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
class ChannelSubscription implements ReleaseSubscription, Partial<Heir> {
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
        for (const signal of signals) signal?.removeEventListener('abort', onAbort);
        this.dequeue(waiter);
        return true;
      };
      const current: WaitInProgress = {
        waiter,
        end: (outcome) => finish() && (resolve(outcome), true),
        reserved: () => sleep(until - performance.now()),
      };
      const onAbort = function (this: AbortSignal): void {
        if (finish()) reject(this.reason as Error);
      };
      this.current = current;
      for (const signal of signals) signal?.addEventListener('abort', onAbort, { once: true });
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
