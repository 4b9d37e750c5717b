import { Logger } from '@nestjs/common';
import type { Cluster, Redis } from 'ioredis';
import type { ReleaseSubscription } from '../interfaces/lock-backend.interface.js';
import { within } from '../utils/within.js';

interface Waiter {
  /** Order of arrival of the caller (kept across its attempts): the queue's sort key. */
  readonly arrival: number;
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
  ready: Promise<void>;
}

/**
 * Wakes waiters when a lock is released. One subscriber connection per module (a `duplicate()`
 * of the command client, created on first use); a channel per lock key, subscribed while at
 * least one waiter in this process wants it.
 *
 * The waiters of one key in one process form a queue in order of arrival. A release wakes the
 * first only: the others would lose the race anyway, and the winner's own release wakes the next.
 * Only the first also retries on a timer (every `retryInterval`), so a lost message costs time,
 * never a hang, and idle waiters cost one command per pause per process, not per waiter; the
 * others sleep until woken, promoted to first, or out of time. A waiter that is woken but gives up
 * before trying passes its wake-up on.
 */
export class ReleaseNotifier {
  private subscriber: Redis | Cluster | undefined;
  private readonly channels = new Map<string, ChannelState>();

  constructor(
    private readonly source: Redis | Cluster,
    /** Longest wait for QUIT when closing the subscriber connection. */
    private readonly commandTimeout: number,
    private readonly logger: Logger,
  ) {}

  watch(channel: string): ReleaseSubscription {
    let state = this.channels.get(channel);
    if (!state) {
      state = { refs: 0, seen: 0, waiters: [], arrivals: 0, ready: this.subscribe(channel) };
      this.channels.set(channel, state);
    }
    state.refs++;
    return new ChannelSubscription(state, () => this.unwatch(channel, state));
  }

  /** Whether any channel is watched at all (cheaper to ask first than `isWatched`). */
  get watching(): boolean {
    return this.channels.size > 0;
  }

  /** Whether callers in this process are already waiting on `channel`. */
  isWatched(channel: string): boolean {
    return this.channels.has(channel);
  }

  /** Closes the subscriber connection. Waiters still sleeping wake on their own timers or signals. */
  async close(): Promise<void> {
    const subscriber = this.subscriber;
    this.subscriber = undefined;
    this.channels.clear();
    if (subscriber) await closeQuietly(subscriber, this.commandTimeout);
  }

  private subscribe(channel: string): Promise<void> {
    const subscriber = (this.subscriber ??= this.createSubscriber());
    return subscriber.subscribe(channel).then(
      () => undefined,
      (error: unknown) => {
        this.logger.warn(
          `Could not subscribe to lock releases on "${channel}"; waiters fall back to polling: ${String(error)}`,
        );
      },
    );
  }

  private unwatch(channel: string, state: ChannelState): void {
    if (--state.refs > 0 || this.channels.get(channel) !== state) return;
    this.channels.delete(channel);
    this.subscriber?.unsubscribe(channel).catch(() => {
      // The connection is gone; there is nothing left to unsubscribe from.
    });
  }

  private createSubscriber(): Redis | Cluster {
    // Redis#duplicate and Cluster#duplicate take different arguments; neither needs any here.
    const subscriber = (this.source as Redis).duplicate();
    subscriber.on('message', (channel: string) => {
      const state = this.channels.get(channel);
      if (!state) return;
      state.seen++;
      state.waiters[0]?.wake();
    });
    subscriber.on('error', (error: Error) => {
      this.logger.warn(`Lock release subscriber: ${error.message}`);
    });
    return subscriber;
  }
}

class ChannelSubscription implements ReleaseSubscription {
  private woken = false;
  private disposed = false;
  private readonly arrival: number;

  constructor(
    private readonly state: ChannelState,
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
  ): Promise<void> {
    this.woken = false;
    if (this.state.seen !== seen) return Promise.resolve();
    const aborted = signals.find((signal) => signal?.aborted);
    if (aborted) return Promise.reject(aborted.reason as Error);
    const { waiters } = this.state;
    const until = performance.now() + limit;
    return new Promise<void>((resolve, reject) => {
      let timer: NodeJS.Timeout | undefined;
      const leave = (): void => {
        clearTimeout(timer);
        for (const signal of signals) signal?.removeEventListener('abort', onAbort);
        const index = waiters.indexOf(waiter);
        if (index < 0) return;
        waiters.splice(index, 1);
        if (index === 0) waiters[0]?.lead();
      };
      const onAbort = function (this: AbortSignal): void {
        leave();
        reject(this.reason as Error);
      };
      const sleep = (ms: number): void => {
        clearTimeout(timer);
        timer = setTimeout(() => (leave(), resolve()), Math.max(0, ms));
      };
      const waiter: Waiter = {
        arrival: this.arrival,
        wake: () => {
          this.woken = true;
          leave();
          resolve();
        },
        lead: () => sleep(Math.min(pause, until - performance.now())),
        follow: () => sleep(until - performance.now()),
      };
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

  dispose(acquired: boolean): void {
    if (this.disposed) return;
    this.disposed = true;
    // Woken by a release but leaving without having used it: hand the wake-up to the next waiter.
    if (this.woken && !acquired) this.state.waiters[0]?.wake();
    this.onDispose();
  }
}

/**
 * Ends a connection this library owns: QUIT when it is up (waiting at most `timeoutMs` for the
 * reply, so a frozen Redis cannot hold shutdown hostage), otherwise, or then, just drop it.
 */
export async function closeQuietly(client: Redis | Cluster, timeoutMs: number): Promise<void> {
  if (client.status === 'ready') {
    try {
      await within(client.quit(), timeoutMs, []);
      return;
    } catch {
      // Fall through to a hard disconnect.
    }
  }
  client.disconnect();
}
