import { randomBytes } from 'node:crypto';
import type {
  AcquireAttempt,
  BackendHealth,
  Election,
  Freed,
  HandoffClaim,
  HeldLease,
  Inspection,
  LockBackend,
  LockShape,
  ReleaseSubscription,
} from '../interfaces/lock-backend.interface.js';
import { PLAIN } from '../options/checks.js';
import { DEFAULT_DRIFT_FACTOR } from '../options/defaults.js';
import type { ResolvedModuleOptions } from '../options/module-options.js';
import {
  announced,
  ChannelSubscription,
  endYield,
  newChannelState,
  takeHeir,
  type ChannelState,
  type Heir,
} from '../redis/channel.subscription.js';
import { holding } from '../redis/handoff.js';
import { YIELD_MS } from '../redis/release.notifier.js';
import { releaseChannel, turnChannel, type InMemoryLockStore } from './in-memory-lock.store.js';

/** A channel this app watches: the waiters' queue, and how to stop hearing the store. */
interface Watched {
  readonly state: ChannelState;
  readonly unsubscribe: () => void;
}

/**
 * The backend of `RedisLockTestingModule`: the lock engine's one seam (`LockBackend`), over an
 * `InMemoryLockStore` instead of Redis. The engine above it (acquire loop, leases, watchdog,
 * re-entry, several keys, leadership, `@WithLock`) is the one every app runs. Waiters of this app
 * queue as they do on Redis (`ChannelSubscription`): a release wakes the first, a plain lock is
 * handed straight to the first waiter that takes handoffs, for `handoffTurn` ms at a stretch.
 */
export class InMemoryLockBackend implements LockBackend {
  readonly replyTimeout: number;
  readonly shapes = true;
  private readonly prefix: string;
  private readonly turn: number;
  /** See `RedisLockBackend.queueStay`. */
  private readonly queueStay: number;
  /** This app's name among the apps waiting for a key (see `InMemoryLockStore.waitIn`). */
  private readonly processId = randomBytes(8).toString('base64url');
  private readonly channels = new Map<string, Watched>();

  constructor(
    private readonly store: InMemoryLockStore,
    options: ResolvedModuleOptions,
  ) {
    this.replyTimeout = options.commandTimeout;
    this.prefix = options.keyPrefix;
    this.turn = options.handoffTurn;
    const { retryInterval, retryJitter } = options.defaults;
    this.queueStay = 2 * (retryInterval + retryJitter + options.commandTimeout);
  }

  /** As on Redis (see `RedisLockBackend.validity`), so that leases end when they would there. */
  validity(ttl: number): number {
    return ttl - ttl * DEFAULT_DRIFT_FACTOR - 2;
  }

  tryAcquire(
    key: string,
    token: string,
    ttl: number,
    shape: LockShape = PLAIN,
    queue = true,
    reserve = false,
  ): Promise<AcquireAttempt> {
    const stay = queue ? this.queueStay : 0;
    const reply = this.store.acquire(this.name(key), token, ttl, shape, stay, !reserve);
    return Promise.resolve(
      typeof reply === 'number'
        ? { acquired: true, fence: reply, fenceLimit: reply, validity: this.validity(ttl) }
        : { acquired: false, ...reply },
    );
  }

  tryAcquireAll(
    keys: readonly string[],
    token: string,
    ttl: number,
  ): Promise<number[] | { retryAfter: number | undefined }> {
    const names = keys.map((key) => this.name(key));
    return Promise.resolve(this.store.acquireAll(names, token, ttl));
  }

  giveUp(key: string, token: string, shape: LockShape): Promise<void> {
    this.store.publish(this.store.giveUp(this.name(key), token, shape));
    return Promise.resolve();
  }

  extend(key: string, token: string, ttl: number, shape = PLAIN): Promise<boolean> {
    return Promise.resolve(this.store.extend(this.name(key), token, ttl, shape));
  }

  release(
    key: string,
    token: string,
    shape: LockShape = PLAIN,
    lease?: HeldLease,
    keep = 0,
  ): Promise<boolean> {
    return Promise.resolve(this.releaseNow(this.name(key), key, token, shape, lease, keep));
  }

  private releaseNow(
    name: string,
    key: string,
    token: string,
    shape: LockShape,
    lease: HeldLease | undefined,
    keep: number,
  ): boolean {
    if (keep > 0) return this.store.extend(name, token, keep, shape);
    const channel = releaseChannel(name);
    // (The store answers at once: a live lease holds the lock where the release lands.)
    const state = this.channels.get(channel)?.state;
    const heir =
      state && shape === PLAIN ? takeHeir(state, holding(lease, 0), this.turn) : undefined;
    if (heir) return this.handOff(key, token, heir);
    const { released, announce } = this.store.release(name, token, shape);
    const heard = this.store.publish(announce);
    if (shape === PLAIN) this.endYield(channel, heard);
    return released;
  }

  /**
   * A release at the end of this app's turn has been announced (`heard` by that many listeners):
   * if no other app's waiters heard it, this app's own first waiter, held back, tries at once
   * (see `ReleaseNotifier.endYield`).
   */
  private endYield(channel: string, heard: number): void {
    const state = this.channels.get(channel)?.state;
    // (This app's own listener heard it too.)
    if (state) endYield(state, heard > 1);
  }

  /** Passes the lock to `heir` in one step of the store (see `InProcessHandoff.handOff`). */
  private handOff(key: string, token: string, heir: Heir): boolean {
    const { token: heirToken, ttl } = heir.claim;
    const sentAt = performance.now();
    const fence = this.store.handOff(this.name(key), token, heirToken, ttl);
    if (fence === 0) {
      heir.wake();
      return false;
    }
    const handoff = { fence, fenceLimit: fence, validity: this.validity(ttl), sentAt };
    heir.grant(handoff, () => void this.release(key, heirToken));
    return true;
  }

  isLocked(key: string): Promise<boolean> {
    return Promise.resolve(this.store.isLocked(this.name(key)));
  }

  isHeld(key: string, token: string): Promise<boolean> {
    return Promise.resolve(this.store.isHeld(this.name(key), token));
  }

  recordTerm(key: string, token: string, id: string, fence: number, ttl: number): Promise<void> {
    this.store.recordTerm(this.name(key), token, id, fence, ttl);
    return Promise.resolve();
  }

  participate(key: string, entry: string, stay: number): Promise<void> {
    this.store.participate(this.name(key), entry, stay);
    return Promise.resolve();
  }

  election(key: string, participants: boolean): Promise<Election> {
    return Promise.resolve(this.store.election(this.name(key), participants));
  }

  inspect(key: string): Promise<Inspection> {
    return Promise.resolve(this.store.inspect(this.name(key)));
  }

  forceRelease(key: string): Promise<Freed> {
    const { announce, ...freed } = this.store.forceRelease(this.name(key));
    this.store.publish(announce);
    return Promise.resolve(freed);
  }

  /** The store never goes away: there is no reconnection to report. */
  onReconnect(): () => void {
    return () => {};
  }

  hasWaiters(key: string): boolean {
    return this.channels.has(releaseChannel(this.name(key)));
  }

  takesTurns(key: string): boolean {
    return this.store.waitsIn(this.name(key), this.processId);
  }

  watchReleases(key: string, claim?: HandoffClaim, turnOf?: string): ReleaseSubscription {
    const name = this.name(key);
    const channel = turnOf === undefined ? releaseChannel(name) : turnChannel(name, turnOf);
    let watched = this.channels.get(channel);
    if (!watched) {
      const state = newChannelState(Promise.resolve());
      // A release: the first waiter tries, unless this app yields it (see `takeHeir`).
      const unsubscribe = this.store.subscribe(channel, () => announced(state, YIELD_MS));
      this.channels.set(channel, (watched = { state, unsubscribe }));
    }
    const { state } = watched;
    state.refs++;
    if (claim) this.store.waitIn(name, this.processId, 1);
    return new ChannelSubscription(state, claim, () => {
      if (claim) this.store.waitIn(name, this.processId, -1);
      if (--state.refs > 0 || this.channels.get(channel)?.state !== state) return;
      this.channels.delete(channel);
      clearTimeout(state.deferred);
      watched.unsubscribe();
    });
  }

  prepare(): Promise<void> {
    return Promise.resolve();
  }

  health(): Promise<BackendHealth> {
    return Promise.resolve({ up: true, details: { store: 'in memory (RedisLockTestingModule)' } });
  }

  /** Stops hearing the store; waiters still asleep wake on their own timers or signals. */
  close(): Promise<void> {
    for (const { state, unsubscribe } of this.channels.values()) {
      clearTimeout(state.deferred);
      unsubscribe();
    }
    this.channels.clear();
    return Promise.resolve();
  }

  /** The name of `key` in the store: as in Redis (see `KeyLayout.lockKey`). */
  private name(key: string): string {
    return `${this.prefix}{${key}}`;
  }
}
