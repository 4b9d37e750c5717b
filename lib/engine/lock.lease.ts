import type { Logger } from '@nestjs/common';
import {
  LockLostError,
  type KeyView,
  type LockLostReason,
  type LockOperation,
} from '../errors/redis-lock.errors.js';
import type {
  HeldLease,
  LockBackend,
  LockShape,
  PendingSwap,
} from '../interfaces/lock-backend.interface.js';
import { PLAIN } from '../options/checks.js';
import type { LockEvents } from './lock.events.js';

/** What a lease needs from the engine that granted it. */
export interface LeaseOwner {
  readonly backend: LockBackend;
  readonly logger: Logger;
  readonly events: LockEvents;
  /** How keys are shown in log lines and messages (the module's `logKeys`). */
  readonly view: KeyView;
  /** Waits for a backend reply for at most `commandTimeout`; failures become `LockBackendError`. */
  readonly reply: <T>(key: string, operation: LockOperation, pending: Promise<T>) => Promise<T>;
}

/**
 * A lock's lease: the expiry timer that aborts `signal` when the TTL runs out unconfirmed, and,
 * with auto-extension, the watchdog that extends it every `ttl / 3`. Extension goes through the
 * owner-checked script, so a lost lock is never re-created. `LockHandle` adds the lock's API.
 *
 * What nobody observes costs nothing: the `AbortController` and the expiry timer are created when
 * `signal` is first read. Until then an overrun lease is noticed by the next thing that asks
 * (`release()`, `extend()`, re-entry, the watchdog, a reconnect check) through `checkExpiry()`.
 *
 * A lock passed on by a release in this process (see `InProcessHandoff.passOn`) starts on its
 * predecessor's lease (no longer than its own TTL's), with the write of its own token and TTL in
 * flight (`swap`): that write is its first extension. Until it is answered, extensions and the
 * release wait for it.
 */
export abstract class Lease implements HeldLease {
  private controller: AbortController | undefined;
  /** Why the lease ended early (lost, or abandoned on shutdown): `signal`'s abort reason. */
  protected endReason: LockLostError | undefined;
  protected state: 'held' | 'released' | 'lost' = 'held';
  private expiry: number;
  private expiryTimer: NodeJS.Timeout | undefined;
  private extendTimer: NodeJS.Timeout | undefined;
  private lastExtendError: unknown;
  private confirmed: number;
  /** See `stopWatchdog`. */
  private watchdogStopped = false;
  /** See `whenLost`. */
  private lossListeners: Set<() => void> | undefined;

  constructor(
    readonly key: string,
    readonly token: string,
    readonly fence: number,
    protected ttl: number,
    /** When the acquisition that granted it was sent (`performance.now()`). */
    protected readonly acquiredAt: number,
    expiresAt: number,
    private readonly autoExtend: boolean,
    protected readonly owner: LeaseOwner,
    /** What it holds: the plain lock, a place in a semaphore, or a read lock. */
    readonly shape: LockShape = PLAIN,
    /** See `HeldLease.fenceLimit`. */
    readonly fenceLimit: number = fence,
    /** Its own token write, when it was passed on before Redis knew. */
    public swap?: PendingSwap,
    /** See `HeldLease.confirmedAt`: `acquiredAt` unless it was passed on. */
    confirmedAt: number = acquiredAt,
  ) {
    this.expiry = expiresAt;
    this.confirmed = confirmedAt;
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

  /** See `HeldLease.confirmedAt`. */
  get confirmedAt(): number {
    return this.confirmed;
  }

  /** Why the lease ended early (`signal`'s abort reason), without creating the signal. */
  get lossReason(): LockLostError | undefined {
    return this.endReason;
  }

  /** True once `release()` has taken the lock's last holder away. */
  get released(): boolean {
    return this.state === 'released';
  }

  /** Whether the acquisition (or the pass-on) that granted it was sent by `time`. */
  askedBy(time: number): boolean {
    return this.acquiredAt <= time;
  }

  /** The TTL the lease is kept with (the last extension's). */
  get leaseTtl(): number {
    return this.ttl;
  }

  /** Whether a watchdog keeps the lease. */
  get extendsItself(): boolean {
    return this.autoExtend;
  }

  /**
   * The watchdog extends the lease no more (an extension on its way still counts): the lease runs
   * out at its expiry unless released first. For a lock on several keys one of which was lost.
   */
  stopWatchdog(): void {
    this.watchdogStopped = true;
    clearTimeout(this.extendTimer);
    this.extendTimer = undefined;
  }

  /**
   * Calls `listener` once when the lease is lost (at once if it is; never if it is released);
   * returns how to stop listening.
   */
  whenLost(listener: () => void): () => void {
    if (this.state === 'lost') listener();
    else (this.lossListeners ??= new Set()).add(listener);
    return () => void this.lossListeners?.delete(listener);
  }

  /** Whether the lock is held still, its lease not run out (which is declared lost if it has). */
  stillHeld(): boolean {
    this.checkExpiry();
    return this.state === 'held';
  }

  /** One extension, shared by `extend()` and the watchdog. Resolves false when the lock is gone. */
  protected async renew(ttl: number): Promise<boolean> {
    const { backend, reply } = this.owner;
    // After the token write, if still in flight (it fails like an extension if unanswered).
    if (this.swap) await reply(this.key, 'extend', this.swap);
    if (this.state !== 'held') return this.state === 'released';
    const sentAt = performance.now();
    const extended = await reply(
      this.key,
      'extend',
      backend.extend(this.key, this.token, ttl, this.shape, this.fence),
    ).catch((error: unknown) => {
      // No answer: Redis may have set the new TTL all the same, counted from when the command
      // came (not before `sentAt`). A shorter one than the lease has left shortens the lease.
      this.shortenTo(sentAt + backend.validity(ttl));
      throw error;
    });
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

  /** The lease ends by `end` at the latest (`performance.now()`); the expiry timer follows. */
  private shortenTo(end: number): void {
    if (end >= this.expiry) return;
    this.expiry = end;
    if (this.controller && this.state === 'held') this.armExpiry();
  }

  /** Redis confirmed the lease for `ttl` from `sentAt`. */
  private confirm(sentAt: number, ttl: number): void {
    this.ttl = ttl;
    this.confirmed = sentAt;
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
    if (this.watchdogStopped) return;
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
          `Could not extend lock ${this.owner.view(this.key)} (fence ${this.fence}), retrying: ${String(error)}`,
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
  protected checkExpiry(): void {
    if (this.state === 'held' && performance.now() >= this.expiry) this.expire();
  }

  /** The lease ran out unconfirmed. */
  private expire(): void {
    this.lose(this.autoExtend ? 'unconfirmed' : 'expired', this.lastExtendError);
  }

  protected lose(reason: Exclude<LockLostReason, 'shutdown' | 'released'>, cause?: unknown): void {
    if (this.state !== 'held') return;
    this.settle('lost');
    const { events } = this.owner;
    if (events.observed) {
      const heldMs = performance.now() - this.acquiredAt;
      events.emit({ type: 'lost', key: this.key, fence: this.fence, heldMs, reason });
    }
    this.end(this.lossError(reason, cause));
    const listeners = this.lossListeners;
    this.lossListeners = undefined;
    for (const listener of listeners ?? []) listener();
  }

  /** How the module shows keys (its `logKeys`). */
  get view(): KeyView {
    return this.owner.view;
  }

  /** The `LockLostError` of this lease for `reason`, its key shown as the module shows keys. */
  lossError(reason: LockLostReason, cause?: unknown): LockLostError {
    const { view } = this.owner;
    return new LockLostError(
      this.key,
      this.token,
      reason,
      cause === undefined ? { view } : { cause, view },
    );
  }

  protected end(reason: LockLostError): void {
    this.endReason = reason;
    this.controller?.abort(reason);
  }

  /** Ends the lease; returns whether it was held until now. */
  protected settle(state: 'released' | 'lost'): boolean {
    const wasHeld = this.state === 'held';
    this.state = state;
    clearTimeout(this.expiryTimer);
    clearTimeout(this.extendTimer);
    this.expiryTimer = this.extendTimer = undefined;
    this.settled(wasHeld);
    return wasHeld;
  }

  /** The lease ended (`wasHeld`: it was held until now). */
  protected abstract settled(wasHeld: boolean): void;
}
