import { LockArgumentError, LockLostError } from '../errors/redis-lock.errors.js';
import type { LockShape, PendingSwap } from '../interfaces/lock-backend.interface.js';
import type { Lock } from '../interfaces/lock.interface.js';
import { PLAIN, ttlProblem } from '../options/checks.js';
import type { Linked } from '../utils/linked-list.js';
import { Lease, type LeaseOwner } from './lock.lease.js';
import {
  cutViews,
  enterHold,
  levelTaken,
  type LockReentry,
  type ReentryLevel,
} from './lock.reentry.js';

/** What a handle needs from the service that created it. */
export interface LockOwnerHooks extends LeaseOwner {
  /** Called once when the handle stops being held (released or lost). */
  settled(lock: LockHandle): void;
}

/**
 * A held lock: the `Lock` API over its lease (see `Lease`), its place among the locks its service
 * holds, `holdAtLeast`, and the turns of the calls nested in its holder's flow (see `enter()`).
 */
export class LockHandle extends Lease implements Lock, Linked<LockHandle>, ReentryLevel {
  /** Neighbours among the locks its service holds (see `LinkedList`). */
  prev: LockHandle | undefined = undefined;
  /** See `prev`. */
  next: LockHandle | undefined = undefined;
  /** See `AcquireOptions.holdAtLeast`: what the caller asked for (0: nothing). */
  holdAtLeast = 0;
  /** Until when (`performance.now()`) a release only shortens the key's TTL (see `releaseInRedis`). */
  private holdUntil = 0;
  /** The view a call nested in its holder's flow took last (see `ReentryLevel`). */
  inner: LockReentry | undefined = undefined;
  /** Calls waiting for their turn to re-enter (see `turnChanged()`). */
  private turn: { promise: Promise<void>; resolve: () => void } | undefined;

  constructor(
    key: string,
    token: string,
    fence: number,
    ttl: number,
    /** When the acquisition that granted it was sent (`performance.now()`). */
    acquiredAt: number,
    expiresAt: number,
    autoExtend: boolean,
    protected override readonly owner: LockOwnerHooks,
    shape: LockShape = PLAIN,
    fenceLimit: number = fence,
    swap?: PendingSwap,
    confirmedAt?: number,
  ) {
    super(
      key,
      token,
      fence,
      ttl,
      acquiredAt,
      expiresAt,
      autoExtend,
      owner,
      shape,
      fenceLimit,
      swap,
      confirmedAt,
    );
  }

  get keys(): readonly string[] {
    return [this.key];
  }

  get fences(): Readonly<Record<string, number>> {
    return { [this.key]: this.fence };
  }

  /** Whether this handle was created by the service that `hooks` belong to. */
  belongsTo(hooks: LockOwnerHooks): boolean {
    return this.owner === hooks;
  }

  /**
   * Re-enters the lock from a call nested in its holder's flow: a view of this hold (see
   * `LockReentry`), whose release ends only the view; `undefined` while another call nested in this
   * flow is inside (a fork of it: it waits for `turnChanged()`).
   * @throws LockLostError if the lease is over
   */
  enter(): LockReentry | undefined {
    return enterHold(this);
  }

  /** Settles when a view of this hold ends, or the hold does: a turn may be free. */
  turnChanged(): Promise<void> {
    if (!this.turn) {
      let resolve!: () => void;
      const promise = new Promise<void>((done) => (resolve = done));
      this.turn = { promise, resolve };
    }
    return this.turn.promise;
  }

  /**
   * A view ended (`later`), or the hold: whoever waits for a turn looks again. After a
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

  /** Not `async`: the release's own reply is returned as it is, without a promise around it. */
  release(): Promise<boolean> {
    if (this.state === 'released') return Promise.resolve(false);
    // A lease that ran out unobserved, or while the event loop could not fire its timer (a frozen
    // process, a blocked loop, I/O handled first after a thaw), is reported now: the signal never
    // stays silent about an overrun just because the release came first.
    this.checkExpiry();
    if (this.settle('released')) this.reportRelease(false);
    // A view still inside (a fork that outlived its section, a forgotten nested acquire()) is
    // told: the lock it re-entered is over.
    if (levelTaken(this)) cutViews(this, this.lossError('released'));
    return this.releaseInRedis();
  }

  /**
   * Gives back a lock no work ran under (a partial acquisition of several keys, a grant
   * that came as shutdown began): deleted at once, whatever `holdAtLeast` asked of a finished job.
   */
  undo(): Promise<boolean> {
    this.holdUntil = 0;
    return this.release();
  }

  async extend(ttl: number = this.ttl): Promise<void> {
    const problem = ttlProblem(ttl);
    if (problem) throw new LockArgumentError('ttl', ttl, problem);
    if (this.state === 'released') throw this.lossError('not-held');
    this.checkExpiry();
    if (this.state === 'lost') throw this.endReason!;
    // Not extended: lost, or released meanwhile with the key found gone (no loss reason then).
    if (!(await this.renew(ttl))) throw this.endReason ?? this.lossError('not-held');
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
   * work still running learns that it no longer holds the lock. `undo`: no work ran under it (a
   * grant that came as shutdown began): deleted, whatever `holdAtLeast` asked.
   */
  async abandon(undo = false): Promise<boolean> {
    if (this.state !== 'held') return false;
    if (undo) this.holdUntil = 0;
    this.settle('released');
    this.reportRelease(true);
    this.end(this.lossError('shutdown'));
    return this.releaseInRedis();
  }

  /**
   * Keeps the key taken until `ms` from now (the grant's reply) even if released
   * sooner (see `AcquireOptions.holdAtLeast`).
   */
  holdFor(ms: number): void {
    this.holdAtLeast = ms;
    this.holdUntil = performance.now() + ms;
  }

  /**
   * The release in Redis; before `holdAtLeast` is over, the key's TTL shortened to what remains
   * instead (owner-checked, as an extension is: nothing is deleted, nothing announced, and nothing
   * passed on to a waiter, which finds the key free at its next timed attempt after it lapsed:
   * by then its pause, from the TTL the key had when it was refused, may end at that TTL).
   */
  private releaseInRedis(): Promise<boolean> {
    const { backend, reply } = this.owner;
    const keep = Math.max(0, Math.ceil(this.holdUntil - performance.now()));
    return reply(
      this.key,
      'release',
      backend.release(this.key, this.token, this.shape, this, keep),
    );
  }

  private reportRelease(shutdown: boolean): void {
    const { events } = this.owner;
    const heldMs = performance.now() - this.acquiredAt;
    if (!shutdown) events.noteHold(this.key, heldMs);
    if (!events.observed) return;
    events.emit({ type: 'released', key: this.key, fence: this.fence, heldMs, shutdown });
  }

  protected override end(reason: LockLostError): void {
    super.end(reason);
    cutViews(this, reason);
  }

  protected settled(wasHeld: boolean): void {
    if (wasHeld) this.owner.settled(this);
    this.turnOver();
  }
}
