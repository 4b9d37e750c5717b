import { Logger } from '@nestjs/common';
import type { Cluster, Redis } from 'ioredis';
import type { ReleaseSubscription } from '../interfaces/lock-backend.interface.js';
import { ignoreDeadline, within } from '../utils/within.js';

interface Waiter {
  wake(): void;
}

interface ChannelState {
  refs: number;
  /** Releases seen on this channel since it was subscribed. */
  seen: number;
  /** Sleeping waiters, oldest first: a release wakes one of them. */
  waiters: Waiter[];
  ready: Promise<void>;
}

/**
 * Wakes waiters when a lock is released. One subscriber connection per module (a `duplicate()`
 * of the command client, created on first use); a channel per lock key, subscribed while at
 * least one waiter in this process wants it.
 *
 * A release wakes the longest-waiting local waiter only: the others would lose the race anyway,
 * and the winner's own release wakes the next. A waiter that is woken but gives up before trying
 * passes its wake-up on. Every wait also has a timer, so a lost message costs time, never a hang.
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
      state = { refs: 0, seen: 0, waiters: [], ready: this.subscribe(channel) };
      this.channels.set(channel, state);
    }
    state.refs++;
    return new ChannelSubscription(state, () => this.unwatch(channel, state));
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
      state.waiters.shift()?.wake();
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

  constructor(
    private readonly state: ChannelState,
    private readonly onDispose: () => void,
  ) {}

  get ready(): Promise<void> {
    return this.state.ready;
  }

  get seen(): number {
    return this.state.seen;
  }

  wait(seen: number, ms: number, signals: readonly (AbortSignal | undefined)[]): Promise<void> {
    this.woken = false;
    if (this.state.seen !== seen) return Promise.resolve();
    const waiters = this.state.waiters;
    let waiter!: Waiter;
    const woken = new Promise<void>((resolve) => {
      waiter = {
        wake: () => {
          this.woken = true;
          resolve();
        },
      };
    });
    waiters.push(waiter);
    return within(woken, ms, signals)
      .catch(ignoreDeadline)
      .finally(() => {
        const index = waiters.indexOf(waiter);
        if (index >= 0) waiters.splice(index, 1);
      });
  }

  dispose(acquired: boolean): void {
    if (this.disposed) return;
    this.disposed = true;
    // Woken by a release but leaving without having used it: hand the wake-up to the next waiter.
    if (this.woken && !acquired) this.state.waiters.shift()?.wake();
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
