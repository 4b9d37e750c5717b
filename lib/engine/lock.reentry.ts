import {
  LockArgumentError,
  type KeyView,
  type LockLostError,
  type LockLostReason,
} from '../errors/redis-lock.errors.js';
import type { LockShape } from '../interfaces/lock-backend.interface.js';
import type { AcquireOptions, Lock } from '../interfaces/lock.interface.js';

/**
 * What a view reads of the hold it re-enters: a `LockHandle` (which creates views, so this file
 * does not import it).
 */
export interface ReentrantHold extends Lock {
  readonly shape: LockShape;
  readonly lossReason: LockLostError | undefined;
  /** How the module shows keys (its `logKeys`). */
  readonly view: KeyView;
  lossError(reason: LockLostReason): LockLostError;
  readonly released: boolean;
  readonly leaseTtl: number;
  readonly extendsItself: boolean;
  readonly holdAtLeast: number;
  belongsTo(hooks: object): boolean;
  stillHeld(): boolean;
  turnChanged(): Promise<void>;
  turnOver(later?: boolean): void;
}

/**
 * A level calls can be nested in: a hold (`LockHandle`) or a view of it. "A level is taken while
 * any call nested in it is inside; the hold's end aborts what is still inside": one call at a
 * time gets a view one level down (`inner`), and a level stays taken while that view, or any view
 * nested in it, is open, even after the view itself ended. Since a level is given to one call at
 * a time, a hold's open views form one chain from it through `inner`, which is all the structure
 * there is: `levelTaken` walks it, `enterLevel` extends it, `cutViews` ends it.
 */
export interface ReentryLevel {
  /** The view a call nested in this level's flow took last (open, or ended). */
  inner: LockReentry | undefined;
}

/** Whether a call nested in `level` is inside: a view below it not ended. */
export function levelTaken(level: ReentryLevel): boolean {
  for (let view = level.inner; view; view = view.inner) if (!view.ended) return true;
  return false;
}

/** A view one level below `level` for the calling flow, or `undefined` while it is taken. */
function enterLevel(level: ReentryLevel, hold: ReentrantHold): LockReentry | undefined {
  if (!hold.stillHeld()) {
    throw hold.lossReason ?? hold.lossError('not-held');
  }
  if (levelTaken(level)) return undefined;
  return (level.inner = new LockReentry(hold));
}

/** The hold ended (`reason`): every view still inside it learns it through its `signal`. */
export function cutViews(hold: ReentryLevel, reason: LockLostError): void {
  for (let view = hold.inner; view; view = view.inner) view.cut(reason);
}

/** Re-enters `hold` from a call nested in its holder's own flow (see `ReentryLevel`). */
export function enterHold(hold: ReentrantHold & ReentryLevel): LockReentry | undefined {
  return enterLevel(hold, hold);
}

/**
 * A re-entry of a held lock by a call nested in its holder's flow: a view of the outer hold, not
 * a second one. It reads the outer lock's fence and lease; its `release()` ends only the view
 * (`true` once if the lock is still held, then `false`) and never touches Redis; extending it
 * extends the outer lock while the view is open. The outer holder's release ends the lock, however
 * many views were forgotten, and aborts the `signal` of every view still inside (reason
 * `released`; a lost hold aborts them with its own reason): a view's signal is its own, so that
 * a call that outlived its section is told, while the section's own signal says nothing of it.
 *
 * One view at a time per level (see `ReentryLevel`): while a call nested in a flow (the
 * holder's, or a view's) is inside, another one nested in the same flow — a fork of it: a promise
 * run side by side, a timer — gets no view and waits its turn (`turnChanged()`), as two requests
 * would. A call nested in the view's own flow re-enters the view (`enter()`), so straight nesting
 * never waits.
 */
export class LockReentry implements Lock, ReentryLevel {
  /** See `ReentryLevel`. */
  inner: LockReentry | undefined = undefined;
  /** This view's own `release()` came. */
  ended = false;
  /** Why the hold ended while this view was still inside, if it did. */
  private cutShort: LockLostError | undefined;
  /** See `whenLost`. */
  private lossListeners: Set<() => void> | undefined;
  private controller: AbortController | undefined;

  constructor(private readonly hold: ReentrantHold) {}

  get key(): string {
    return this.hold.key;
  }

  get keys(): readonly string[] {
    return this.hold.keys;
  }

  get token(): string {
    return this.hold.token;
  }

  get fence(): number {
    return this.hold.fence;
  }

  get fences(): Readonly<Record<string, number>> {
    return this.hold.fences;
  }

  get expiresAt(): number {
    return this.hold.expiresAt;
  }

  /**
   * Aborts when the hold ends while this view is inside (`cut`): released by its outer holder, or
   * lost. Created when first read; reading the hold's own signal arms the hold's expiry timer.
   */
  get signal(): AbortSignal {
    if (!this.controller) {
      const controller = (this.controller = new AbortController());
      void this.hold.signal; // may find the lease over, and cut this view
      const reason = this.lossReason;
      if (reason && !this.ended && !controller.signal.aborted) controller.abort(reason);
    }
    return this.controller.signal;
  }

  /** What the outer lock holds. */
  get shape(): LockShape {
    return this.hold.shape;
  }

  /** Why this view's hold ended early, without creating its signal. */
  get lossReason(): LockLostError | undefined {
    return this.cutShort ?? this.hold.lossReason;
  }

  /** True once this view was released, or the outer lock was. */
  get released(): boolean {
    return this.ended || this.hold.released;
  }

  /** Whether the outer lock was created by the service that `hooks` belong to. */
  belongsTo(hooks: object): boolean {
    return this.hold.belongsTo(hooks);
  }

  /** See `LockHandle.view`. */
  get view(): KeyView {
    return this.hold.view;
  }

  /** See `LockHandle.leaseTtl`. */
  get leaseTtl(): number {
    return this.hold.leaseTtl;
  }

  /** See `LockHandle.extendsItself`. */
  get extendsItself(): boolean {
    return this.hold.extendsItself;
  }

  /** See `LockHandle.holdAtLeast`. */
  get holdAtLeast(): number {
    return this.hold.holdAtLeast;
  }

  /**
   * Re-enters the outer lock again, from a call nested in this view's flow; `undefined` while
   * another call nested in it is inside (see the class comment).
   * @throws LockLostError if the lease is over
   */
  enter(): LockReentry | undefined {
    return enterLevel(this, this.hold);
  }

  /** See `LockHandle.turnChanged`. */
  turnChanged(): Promise<void> {
    return this.hold.turnChanged();
  }

  /** The hold ended while this view may be inside: see `cutViews`. */
  cut(reason: LockLostError): void {
    if (this.ended || this.cutShort) return;
    this.cutShort = reason;
    this.controller?.abort(reason);
    const listeners = this.lossListeners;
    this.lossListeners = undefined;
    for (const listener of listeners ?? []) listener();
  }

  /**
   * Calls `listener` once when the hold ends while this view is inside (lost, or released by its
   * outer holder: see `cut`), at once if it has; returns how to stop listening.
   */
  whenLost(listener: () => void): () => void {
    if (this.cutShort) listener();
    else (this.lossListeners ??= new Set()).add(listener);
    return () => void this.lossListeners?.delete(listener);
  }

  /** Whether the hold is still held and this view not cut short (see `LockHandle.stillHeld`). */
  stillHeld(): boolean {
    return this.hold.stillHeld() && this.cutShort === undefined;
  }

  /** Ends this view: whether the lock was still held, once; `false` after. Redis is not asked. */
  release(): Promise<boolean> {
    if (this.ended) return Promise.resolve(false);
    // Asked before the view ends: a lease that ran out unnoticed (the event loop frozen or
    // blocked past it) aborts this view's signal too, as a hold's release aborts its own.
    const held = this.hold.stillHeld();
    this.ended = true;
    this.hold.turnOver(true);
    return Promise.resolve(this.cutShort === undefined && held);
  }

  /** An undo (no work ran): the same as `release()` for a view. */
  undo(): Promise<boolean> {
    return this.release();
  }

  extend(ttl?: number): Promise<void> {
    if (this.released || this.cutShort) {
      return Promise.reject(this.cutShort ?? this.hold.lossError('not-held'));
    }
    return this.hold.extend(ttl);
  }
}

/** How an error names a shape. */
function describeShape(shape: LockShape): string {
  if (shape.mode === 'read') return 'a read lock';
  if (shape.limit > 1) return `limit ${shape.limit}`;
  return shape.fair ? 'a fair lock' : 'a plain lock';
}

/**
 * Throws `LockArgumentError` naming the option if a call nested in the flow of `held` asks for
 * what a view of it cannot give: another shape, or a `ttl`, `autoExtend` or `token` other than
 * the outer hold's (options left out take the outer hold's).
 */
export function assertReentry(
  key: string,
  held: KeyHoldLike,
  options: AcquireOptions | undefined,
  shape: LockShape,
): void {
  const outer = held.shape;
  const reject = (option: string, value: unknown, outerValue: string): never => {
    throw new LockArgumentError(
      option,
      value,
      `this call chain already holds ${held.view(key)} with ${outerValue}: a nested call re-enters that hold and cannot change it (leave the option out, or ask for the same)`,
    );
  };
  if (outer.limit !== shape.limit || outer.mode !== shape.mode || outer.fair !== shape.fair) {
    reject('limit + mode + fair', shape, `${describeShape(outer)} (no upgrade from read to write)`);
  }
  if (options?.ttl !== undefined && options.ttl !== held.leaseTtl) {
    reject('ttl', options.ttl, `ttl ${held.leaseTtl}`);
  }
  if (options?.autoExtend !== undefined && options.autoExtend !== held.extendsItself) {
    reject('autoExtend', options.autoExtend, `autoExtend ${held.extendsItself}`);
  }
  if (options?.holdAtLeast !== undefined && options.holdAtLeast !== held.holdAtLeast) {
    reject('holdAtLeast', options.holdAtLeast, `holdAtLeast ${held.holdAtLeast}`);
  }
  if (options?.token !== undefined && options.token !== held.token) {
    reject('token', options.token, 'another token');
  }
}

/** What `assertReentry` reads of a hold or a view. */
type KeyHoldLike = Pick<
  LockReentry,
  'shape' | 'leaseTtl' | 'extendsItself' | 'holdAtLeast' | 'token' | 'view'
>;
