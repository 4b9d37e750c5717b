import type { Logger } from '@nestjs/common';
import {
  LockArgumentError,
  LockLostError,
  type LockLostReason,
  type LockOperation,
} from './errors/redis-lock.errors.js';
import type {
  HeldLease,
  LockBackend,
  LockShape,
  PendingSwap,
} from './interfaces/lock-backend.interface.js';
import type { Lock } from './interfaces/lock.interface.js';
import type { Linked } from './utils/linked-list.js';
import { LockReentry } from './lock.reentry.js';
import type { LockEvents } from './lock.events.js';
import { PLAIN, ttlProblem } from './redis-lock.options.js';

/** What a handle needs from the service that created it. */
export interface LockOwnerHooks {
  readonly backend: LockBackend;
  readonly logger: Logger;
  readonly events: LockEvents;
  /** Waits for a backend reply for at most `commandTimeout`; failures become `LockBackendError`. */
  readonly reply: <T>(key: string, operation: LockOperation, pending: Promise<T>) => Promise<T>;
  /** Called once when the handle stops being held (released or lost). */
  settled(lock: LockHandle): void;
}

/**
 * A held lock and its lease: the expiry timer that aborts `signal` when the TTL runs out
 * unconfirmed, and, with auto-extension, the watchdog that extends it every `ttl / 3`.
 * Extension goes through the owner-checked script, so a lost lock is never re-created.
 *
 * What nobody observes costs nothing: the `AbortController` and the expiry timer are created when
 * `signal` is first read. Until then an overrun lease is noticed by the next thing that asks
 * (`release()`, `extend()`, re-entry, the watchdog, a reconnect check) through `checkExpiry()`.
 *
 * A lock passed on by a release in this process (see `RedisLockBackend.passOn`) starts on its
 * predecessor's lease (no longer than its own TTL's), with the write of its own token and TTL in flight (`swap`): that write is
 * its first extension. Until it is answered, extensions and the release wait for it.
 */
export class LockHandle implements Lock, HeldLease, Linked<LockHandle> {
  /** @internal Neighbours among the locks its service holds (see `LinkedList`). */
  prev: LockHandle | undefined = undefined;
  /** @internal */
  next: LockHandle | undefined = undefined;
  private controller: AbortController | undefined;
  /** Why the lease ended early (lost, or abandoned on shutdown): `signal`'s abort reason. */
  private endReason: LockLostError | undefined;
  private state: 'held' | 'released' | 'lost' = 'held';
  private expiry: number;
  private expiryTimer: NodeJS.Timeout | undefined;
  private extendTimer: NodeJS.Timeout | undefined;
  private lastExtendError: unknown;
  /** @internal See `AcquireOptions.holdAtLeast`: what the caller asked for (0: nothing). */
  holdAtLeast = 0;
  /** Until when (`performance.now()`) a release only shortens the key's TTL (see `releaseInRedis`). */
  private holdUntil = 0;
  /** The view of this hold that a call nested in its flow has open, if any (see `enter()`). */
  private inner: LockReentry | undefined;
  /** Calls waiting for their turn to re-enter (see `turnChanged()`). */
  private turn: { promise: Promise<void>; resolve: () => void } | undefined;

  constructor(
    readonly key: string,
    readonly token: string,
    readonly fence: number,
    private ttl: number,
    /** When the acquisition that granted it was sent (`performance.now()`). */
    private readonly acquiredAt: number,
    expiresAt: number,
    private readonly autoExtend: boolean,
    private readonly owner: LockOwnerHooks,
    /** What it holds: the plain lock, a place in a semaphore, or a read lock. */
    readonly shape: LockShape = PLAIN,
    /** @internal See `HeldLease.fenceLimit`. */
    readonly fenceLimit: number = fence,
    /** @internal Its own token write, when it was passed on before Redis knew. */
    public swap?: PendingSwap,
  ) {
    this.expiry = expiresAt;
    if (swap) this.awaitSwap(swap);
    else if (autoExtend) this.extendWhenDue();
  }

  get signal(): AbortSignal {
    if (!this.controller) {
      this.controller = new AbortController();
      this.checkExpiry();
      if (this.endReason) this.controller.abort(this.endReason);
      else if (this.state === 'held') this.armExpiry();
    }
    return this.controller.signal;
  }

  get expiresAt(): number {
    return this.expiry;
  }

  get keys(): readonly string[] {
    return [this.key];
  }

  get fences(): Readonly<Record<string, number>> {
    return { [this.key]: this.fence };
  }

  /** @internal Why the lease ended early (`signal`'s abort reason), without creating the signal. */
  get lossReason(): LockLostError | undefined {
    return this.endReason;
  }

  /** True once `release()` has taken the lock's last holder away. */
  get released(): boolean {
    return this.state === 'released';
  }

  /** Whether this handle was created by the service that `hooks` belong to. */
  belongsTo(hooks: LockOwnerHooks): boolean {
    return this.owner === hooks;
  }

  /** @internal The TTL the lease is kept with (the last extension's). */
  get leaseTtl(): number {
    return this.ttl;
  }

  /** @internal Whether a watchdog keeps the lease. */
  get extendsItself(): boolean {
    return this.autoExtend;
  }

  /**
   * Re-enters the lock from a call nested in its holder's flow: a view of this hold (see
   * `LockReentry`), whose release ends only the view; `undefined` while another call nested in this
   * flow is inside (a fork of it: it waits for `turnChanged()`).
   * @throws LockLostError if the lease is over
   */
  enter(): LockReentry | undefined {
    if (!this.stillHeld())
      throw this.endReason ?? new LockLostError(this.key, this.token, 'not-held');
    if (this.inner && !this.inner.released) return undefined;
    return (this.inner = new LockReentry(this));
  }

  /** @internal Settles when a view of this hold ends, or the hold does: a turn may be free. */
  turnChanged(): Promise<void> {
    if (!this.turn) {
      let resolve!: () => void;
      const promise = new Promise<void>((done) => (resolve = done));
      this.turn = { promise, resolve };
    }
    return this.turn.promise;
  }

  /**
   * @internal A view ended (`later`), or the hold: whoever waits for a turn looks again. After a
   * view, not before the flow it returned to has run what it runs without waiting: a section
   * that ends right after its nested call ends the hold before a fork that waited looks, and the
   * fork then takes the key afresh instead of a view the section's end would cut short.
   */
  turnOver(later = false): void {
    const turn = this.turn;
    if (!turn) return;
    this.turn = undefined;
    if (later) setImmediate(turn.resolve);
    else turn.resolve();
  }

  /** Whether the lock is held still, its lease not run out (which is declared lost if it has). */
  stillHeld(): boolean {
    this.checkExpiry();
    return this.state === 'held';
  }

  /** Not `async`: the release's own reply is returned as it is, without a promise around it. */
  release(): Promise<boolean> {
    if (this.state === 'released') return Promise.resolve(false);
    // A lease that ran out unobserved, or while the event loop could not fire its timer (a frozen
    // process, a blocked loop, I/O handled first after a thaw), is reported now: the signal never
    // stays silent about an overrun just because the release came first.
    this.checkExpiry();
    if (this.settle('released')) this.reportRelease(false);
    return this.releaseInRedis();
  }

  async extend(ttl: number = this.ttl): Promise<void> {
    const problem = ttlProblem(ttl);
    if (problem) throw new LockArgumentError('ttl', ttl, problem);
    if (this.state === 'released') throw new LockLostError(this.key, this.token, 'not-held');
    this.checkExpiry();
    if (this.state === 'lost') throw this.endReason!;
    if (!(await this.renew(ttl))) throw this.endReason!;
  }

  /**
   * Checks with Redis that the lock is still ours, and aborts `signal` ('not-held') if it is not:
   * run when the connection comes back, since Redis may have restarted empty or failed over
   * meanwhile. Changes nothing in Redis. A failed check is left to the watchdog and the expiry.
   */
  async verify(): Promise<void> {
    this.checkExpiry();
    // A token write in flight is itself the check (and a check sent before it would fail).
    if (this.state !== 'held' || this.swap) return;
    const { backend, reply } = this.owner;
    const held = await reply(this.key, 'verify', backend.isHeld(this.key, this.token)).catch(
      () => true,
    );
    if (!held) this.lose('not-held');
  }

  /**
   * Ends the lease because the module shuts down: releases it in Redis and aborts `signal`, so
   * work still running learns that it no longer holds the lock.
   */
  async abandon(): Promise<boolean> {
    if (this.state !== 'held') return false;
    this.settle('released');
    this.reportRelease(true);
    this.end(new LockLostError(this.key, this.token, 'shutdown'));
    return this.releaseInRedis();
  }

  /**
   * @internal Keeps the key taken until `ms` from now (the grant's reply) even if released
   * sooner (see `AcquireOptions.holdAtLeast`).
   */
  holdFor(ms: number): void {
    this.holdAtLeast = ms;
    this.holdUntil = performance.now() + ms;
  }

  /**
   * The release in Redis; before `holdAtLeast` is over, the key's TTL shortened to what remains
   * instead (owner-checked, as an extension is: nothing is deleted, nothing announced, and nothing
   * passed on to a waiter, which gets the key when it expires).
   */
  private releaseInRedis(): Promise<boolean> {
    const { backend, reply } = this.owner;
    const left = Math.ceil(this.holdUntil - performance.now());
    if (left <= 0) {
      return reply(this.key, 'release', backend.release(this.key, this.token, this.shape, this));
    }
    const shorten = async (): Promise<boolean> => {
      // After this lease's own token write, if still in flight (see the class comment).
      if (this.swap) await this.swap.catch(() => undefined);
      return backend.extend(this.key, this.token, left, this.shape);
    };
    return reply(this.key, 'release', shorten());
  }

  /** One extension, shared by `extend()` and the watchdog. Resolves false when the lock is gone. */
  private async renew(ttl: number): Promise<boolean> {
    const { backend, reply } = this.owner;
    // After the token write, if still in flight (it fails like an extension if unanswered).
    if (this.swap) await reply(this.key, 'extend', this.swap);
    if (this.state !== 'held') return this.state === 'released';
    const sentAt = performance.now();
    const extended = await reply(
      this.key,
      'extend',
      backend.extend(this.key, this.token, ttl, this.shape),
    );
    // The lease ran out before Redis confirmed: lost, as if the expiry timer had fired first.
    this.checkExpiry();
    if (this.state !== 'held') return extended && this.state !== 'lost';
    if (!extended) {
      this.lose('not-held');
      return false;
    }
    this.confirm(sentAt, ttl);
    const { events } = this.owner;
    if (events.observed) events.emit({ type: 'extended', key: this.key, fence: this.fence, ttl });
    return true;
  }

  /** Redis confirmed the lease for `ttl` from `sentAt`. */
  private confirm(sentAt: number, ttl: number): void {
    this.ttl = ttl;
    this.expiry = sentAt + this.owner.backend.validity(ttl);
    this.lastExtendError = undefined;
    if (this.controller) this.armExpiry();
  }

  /**
   * Follows this lock's token write (see the class comment): answered, the lease runs from when it
   * was sent; the lock found no longer its predecessor's, it is lost; no answer, the lease stays
   * its predecessor's and the watchdog, if on, goes on trying to extend it.
   */
  private awaitSwap(swap: PendingSwap): void {
    const done = (): void => {
      if (this.swap === swap) this.swap = undefined;
    };
    swap.then(done, done);
    this.owner.reply(this.key, 'extend', swap).then(
      (sentAt) => {
        this.checkExpiry();
        if (this.state !== 'held') return;
        if (sentAt === undefined) return this.lose('not-held');
        this.confirm(sentAt, this.ttl);
        if (this.autoExtend) this.extendWhenDue();
      },
      (error: unknown) => {
        if (this.state !== 'held') return;
        this.lastExtendError = error;
        if (this.autoExtend) this.scheduleExtension(0);
      },
    );
  }

  /**
   * Next extension when a third of the lease has passed, counted (as the lease is) from when the
   * last acquisition or extension was sent: on a link whose round trip exceeds ttl / 3,
   * extensions go back to back instead of letting the lease run out between them.
   */
  private extendWhenDue(): void {
    this.scheduleExtension(Math.max(0, this.expiry - (2 * this.ttl) / 3 - performance.now()));
  }

  private scheduleExtension(delay: number): void {
    this.extendTimer = setTimeout(() => void this.autoExtendOnce(), delay);
    this.extendTimer.unref();
  }

  private async autoExtendOnce(): Promise<void> {
    this.extendTimer = undefined;
    this.checkExpiry();
    if (this.state !== 'held') return;
    try {
      if (await this.renew(this.ttl)) this.extendWhenDue();
    } catch (error) {
      if (this.state !== 'held') return;
      // Keep trying until the expiry timer declares the lock unconfirmed; warn once per outage.
      if (this.lastExtendError === undefined) {
        this.owner.logger.warn(
          `Could not extend lock "${this.key}" (fence ${this.fence}), retrying: ${String(error)}`,
        );
      }
      this.lastExtendError = error;
      this.scheduleExtension(Math.max(this.ttl / 10, 10));
    }
  }

  private armExpiry(): void {
    clearTimeout(this.expiryTimer);
    this.expiryTimer = setTimeout(
      () => this.expiryDue(),
      Math.max(0, this.expiry - performance.now()),
    );
    this.expiryTimer.unref();
  }

  /**
   * The expiry timer fired. Node keeps timers in whole milliseconds of libuv's loop clock, which
   * can lag `performance.now()`, so a timer may fire a millisecond or two early (0.4 ms seen in
   * CI): the lease is not over before `expiry`, so then it waits the rest.
   */
  private expiryDue(): void {
    if (this.state !== 'held') return;
    if (performance.now() < this.expiry) this.armExpiry();
    else this.expire();
  }

  /** Declares the lease lost if it ran out unconfirmed and no timer has said so yet. */
  private checkExpiry(): void {
    if (this.state === 'held' && performance.now() >= this.expiry) this.expire();
  }

  /** The lease ran out unconfirmed. */
  private expire(): void {
    this.lose(this.autoExtend ? 'unconfirmed' : 'expired', this.lastExtendError);
  }

  private lose(reason: Exclude<LockLostReason, 'shutdown'>, cause?: unknown): void {
    if (this.state !== 'held') return;
    this.settle('lost');
    const { events } = this.owner;
    if (events.observed) {
      const heldMs = performance.now() - this.acquiredAt;
      events.emit({ type: 'lost', key: this.key, fence: this.fence, heldMs, reason });
    }
    this.end(
      new LockLostError(this.key, this.token, reason, cause === undefined ? undefined : { cause }),
    );
  }

  private end(reason: LockLostError): void {
    this.endReason = reason;
    this.controller?.abort(reason);
  }

  /** Ends the lease; returns whether it was held until now. */
  private settle(state: 'released' | 'lost'): boolean {
    const wasHeld = this.state === 'held';
    this.state = state;
    clearTimeout(this.expiryTimer);
    clearTimeout(this.extendTimer);
    this.expiryTimer = this.extendTimer = undefined;
    if (wasHeld) this.owner.settled(this);
    this.turnOver();
    return wasHeld;
  }

  private reportRelease(shutdown: boolean): void {
    const { events } = this.owner;
    if (!events.observed) return;
    const heldMs = performance.now() - this.acquiredAt;
    events.emit({ type: 'released', key: this.key, fence: this.fence, heldMs, shutdown });
  }
}
