import type { Logger } from '@nestjs/common';
import { Observable, Subject } from 'rxjs';
import { quoteKey, type KeyView } from '../errors/redis-lock.errors.js';
import type { LockEvent } from '../interfaces/lock-event.interface.js';

/** How many keys' hold times `LockEvents` keeps (the most recently released). */
const HOLD_KEYS = 1_000;

/**
 * The lock events of one `LockService`. Free while nobody listens: emitters check `observed`
 * before they build an event. Events are delivered synchronously, in order, to every subscriber;
 * what a subscriber does (or throws) never reaches the lock operation that emitted the event.
 */
export class LockEvents {
  private readonly subject = new Subject<LockEvent>();
  private subscribers = 0;
  /** Whether an event is being delivered, and those to deliver after it (see `emit`). */
  private delivering = false;
  private readonly backlog: LockEvent[] = [];
  /** How long each key's holds in this process lasted lately: a moving average, in ms. */
  private readonly holds = new Map<string, number>();
  readonly observable: Observable<LockEvent>;

  constructor(
    private readonly logger: Logger,
    /** How events show keys: as they are, unless the module's `logKeys` hashes or hides them. */
    private readonly view: KeyView = quoteKey,
  ) {
    this.observable = new Observable<LockEvent>((subscriber) => {
      this.subscribers++;
      const subscription = this.subject.subscribe(subscriber);
      return () => {
        this.subscribers--;
        subscription.unsubscribe();
      };
    });
  }

  /** Whether anyone listens: build and emit events only then. */
  get observed(): boolean {
    return this.subscribers > 0;
  }

  /** A key as events show it: as it is, unless the module's `logKeys` hashes or hides keys. */
  shown(key: string): string {
    return this.view === quoteKey ? key : this.view(key);
  }

  emit(event: LockEvent): void {
    event.key = this.shown(event.key);
    // An event a subscriber causes while it hears another (a release on `acquired`) waits until
    // every subscriber has heard that one: each sees the events in the order they happened.
    if (this.delivering) return void this.backlog.push(event);
    this.delivering = true;
    try {
      this.deliver(event);
      for (let next = this.backlog.shift(); next; next = this.backlog.shift()) this.deliver(next);
    } finally {
      this.delivering = false;
      this.backlog.length = 0;
    }
  }

  private deliver(event: LockEvent): void {
    try {
      this.subject.next(event);
    } catch (error) {
      // rxjs reports a subscriber's own error asynchronously; this only guards against an
      // operator chain that throws synchronously.
      this.logger.warn(`A LockService.events subscriber threw: ${String(error)}`);
    }
  }

  /**
   * Notes how long a hold of `key` lasted (at its release), for `expectedWaitMs`. Kept for the
   * last `HOLD_KEYS` keys released, so a stream of distinct keys costs bounded memory.
   */
  noteHold(key: string, heldMs: number): void {
    const before = this.holds.get(key);
    if (before === undefined) {
      if (this.holds.size >= HOLD_KEYS) this.holds.delete(this.holds.keys().next().value as string);
      this.holds.set(key, heldMs);
    } else {
      // Moved to the end, the most recently released; each hold weighs a quarter.
      this.holds.delete(key);
      this.holds.set(key, before + (heldMs - before) / 4);
    }
  }

  /**
   * How long a caller that found `key` taken may expect to wait: how long a hold of it lasts, as
   * this process saw lately, but no longer than the holder's lock still runs (`remainingMs`);
   * `undefined` if this process saw no hold of it, or if no holder's remaining TTL is known
   * (nobody held it: a grant that came too late). The instances of an app run the same code, so
   * the holds one of them sees stand for the others'.
   */
  expectedWaitMs(key: string, remainingMs: number | undefined): number | undefined {
    const typical = this.holds.get(key);
    return typical === undefined || remainingMs === undefined
      ? undefined
      : Math.min(typical, remainingMs);
  }

  /** Completes the stream (module shutdown). */
  complete(): void {
    this.subject.complete();
  }
}
