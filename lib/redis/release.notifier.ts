import { Logger } from '@nestjs/common';
import type { Cluster, Redis } from 'ioredis';
import type { HandoffClaim, ReleaseSubscription } from '../interfaces/lock-backend.interface.js';
import { DEFAULT_HANDOFF_TURN } from '../options/defaults.js';
import {
  announced,
  ChannelSubscription,
  endYield,
  newChannelState,
  takeHeir,
  type ChannelState,
  type Heir,
} from './channel.subscription.js';
import { closeQuietly, watchConnection } from './connections.js';
import { OutageLog } from '../utils/outage-log.js';

const NOT_SHARDED = Promise.resolve(false);

/**
 * How long this process's waiters hold back after such a release when other processes wait too:
 * they would otherwise win the race for it (their process is already running, the others must be
 * woken), and the lock would never leave a busy process. Past it they try anyway, in case nobody
 * else took the lock.
 */
export const YIELD_MS = 5;

/**
 * How long this process's waiters hold back after its release named another process to try next
 * (see `NAME_NEXT`): it is that process's turn, which it takes as soon as its event loop runs.
 * Past it they try anyway, in case that process is gone.
 */
const NAMED_YIELD_MS = 50;

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
  /**
   * Subscriptions refused (a Redis user without the lock channels): one warning, not one per key,
   * until one is made again.
   */
  private readonly refusals: OutageLog;

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
    /** This process's name in the queues of waiting processes (see `NAME_NEXT`), if it queues. */
    private readonly processId?: string,
  ) {
    this.refusals = new OutageLog(logger, 'Subscribing to lock releases');
  }

  watch(channel: string, claim?: HandoffClaim): ReleaseSubscription {
    let state = this.channels.get(channel);
    if (!state) {
      state = newChannelState(this.subscribe(channel));
      this.channels.set(channel, state);
    }
    state.refs++;
    if (claim) state.turnTakers++;
    const watched = state;
    return new ChannelSubscription(state, claim, () => {
      if (claim) watched.turnTakers--;
      this.unwatch(channel, watched);
    });
  }

  /**
   * Whether callers of this process wait on `channel` that take turns with other processes (see
   * `ChannelState.turnTakers`): a release then puts this process at the back of the key's queue
   * of waiting processes (see `NAME_NEXT`), else it leaves it.
   */
  takesTurns(channel: string): boolean {
    return (this.channels.get(channel)?.turnTakers ?? 0) > 0;
  }

  /** Whether any channel is watched at all (cheaper to ask first than `isWatched`). */
  get watching(): boolean {
    return this.channels.size > 0;
  }

  /**
   * Takes the first waiter of `channel` out of the queue so that a release can hand it the lock
   * directly (with `holding`, also one whose attempt is on its way: see `firstInLine`), or
   * returns undefined: nobody waits, the first waiter takes no handoffs, or this
   * process's turn (`handoffTurn` from its first handoff) is over. In that last case this release
   * frees the lock and this process yields it: its waiters hold back when the release message
   * comes, until `endYield()` says that no other process waits, or for `YIELD_MS`. Without the
   * turn, a busy process would pass a hot lock among its own workers for ever.
   */
  takeHeir(channel: string, holding: boolean): Heir | undefined {
    const state = this.channels.get(channel);
    return state && takeHeir(state, holding, this.turn);
  }

  /**
   * The yielding release of `channel` is done: if no other process got its message, this
   * process's first waiter tries now instead of holding back.
   */
  endYield(channel: string, othersWaiting: boolean): void {
    const state = this.channels.get(channel);
    if (state) endYield(state, othersWaiting);
  }

  /** Whether callers in this process are already waiting on `channel`. */
  isWatched(channel: string): boolean {
    return this.channels.has(channel);
  }

  /**
   * Closes the subscriber connection, by `deadline` (`performance.now()`). Waiters still sleeping
   * wake on their own timers or signals.
   */
  async close(deadline = performance.now() + this.commandTimeout): Promise<void> {
    const subscribers = this.subscribers ?? [];
    this.subscribers = undefined;
    for (const state of this.channels.values()) clearTimeout(state.deferred);
    this.channels.clear();
    await Promise.all(
      subscribers.map((subscriber) => closeQuietly(subscriber, deadline - performance.now())),
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
          this.sharded
            ? subscriber.ssubscribe(this.unprefixed(channel))
            : subscriber.subscribe(channel),
        ),
      );
      this.refusals.recovered();
    } catch (error) {
      this.refusals.failed(error, POLLING);
    }
  }

  private unwatch(channel: string, state: ChannelState): void {
    if (--state.refs > 0 || this.channels.get(channel) !== state) return;
    this.channels.delete(channel);
    clearTimeout(state.deferred);
    for (const subscriber of this.subscribers ?? []) {
      (this.sharded
        ? subscriber.sunsubscribe(this.unprefixed(channel))
        : subscriber.unsubscribe(channel)
      ).catch(() => {
        // The connection is gone; there is nothing left to unsubscribe from.
      });
    }
  }

  /**
   * `channel` without the client's own ioredis `keyPrefix`: ioredis counts the channels of
   * `SSUBSCRIBE` and `SUNSUBSCRIBE` as keys and prefixes them itself (not those of `SUBSCRIBE`),
   * while the channels here carry the prefix already (see `KeyLayout`), as messages name them.
   */
  private unprefixed(channel: string): string {
    const prefix = (this.sources[0]?.options as { keyPrefix?: string } | undefined)?.keyPrefix;
    return prefix && channel.startsWith(prefix) ? channel.slice(prefix.length) : channel;
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
      if (state) this.released(state, message);
    });
    watchConnection(subscriber, 'Lock release subscriber', this.logger);
    return subscriber;
  }

  /**
   * A release message on a watched channel: empty (anyone may try), naming the process whose turn
   * it is (`>` and its id, see `NAME_NEXT`), or in Redlock mode the release's id (announced on
   * every node: counted once). A release naming another process wakes nobody here, unless this
   * process made it at the end of its turn (its waiters then hold back a while, see
   * `NAMED_YIELD_MS`) or its first waiter is not in the queue (a caller's own token takes no
   * handoffs and queues no process: it tries at every release, as before).
   */
  private released(state: ChannelState, message: string): void {
    let holdBack = YIELD_MS;
    const alone = state.alone;
    state.alone = false;
    if (message.startsWith('>')) {
      if (alone || message.slice(1) === this.processId) {
        state.yielding = false;
        clearTimeout(state.deferred);
        state.deferred = undefined;
      } else if (state.yielding) {
        holdBack = NAMED_YIELD_MS;
      } else if (state.waiters[0]?.subscription.claim) {
        return;
      }
    } else if (message !== '') {
      if (message === state.lastMessage) return;
      state.lastMessage = message;
    }
    announced(state, holdBack);
  }

  /**
   * Subscribes `subscriber` (a `Redis`, created with `autoResubscribe: false`) to every watched
   * channel again each time it is ready after losing its connection. ioredis' own resubscription
   * sends SUBSCRIBE and drops the promise it gets: if the connection goes again before the reply
   * (a reset right after a reconnection; with `maxRetriesPerRequest: 0`, at once), that promise
   * rejects with nobody to handle it, an unhandled rejection in the app (seen in the chaos suite).
   * Here a resubscription Redis refuses (the user lost the lock channels) is said, once for every
   * key (`refusals`); one lost with the connection is dropped: the next `ready` resubscribes.
   * Meanwhile the first waiter of each key polls.
   */
  private resubscribing(subscriber: Redis): Redis {
    let dropped = false;
    subscriber.on('close', () => void (dropped = true));
    subscriber.on('ready', () => {
      if (!dropped) return;
      dropped = false;
      const channels = [...this.channels.keys()];
      if (channels.length === 0) return;
      subscriber.subscribe(...channels).then(
        () => this.refusals.recovered(),
        (error: unknown) => {
          // Refused (the Redis user lost the lock channels): said, once for all keys. Else lost
          // again before the reply: see above.
          if (/NOPERM/.test(String(error))) this.refusals.failed(error, POLLING);
        },
      );
    });
    return subscriber;
  }
}

/** What waiters do while their channels cannot be subscribed to. */
const POLLING =
  'waiters of the keys it fails for find them free at their timed attempts (every retryInterval) instead of at once';

/** A wait in progress: its place in the queue and how to end it. */
