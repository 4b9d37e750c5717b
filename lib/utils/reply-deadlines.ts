import { LinkedList, type Linked } from './linked-list.js';
import { onAbort } from './abort-listeners.js';
import { abandon, DEADLINE } from './within.js';

interface Pending extends Linked<Pending> {
  readonly due: number;
  readonly reject: (reason: unknown) => void;
  /** Rejected by `interrupt()` (acquisition attempts; not releases, which shutdown waits for). */
  readonly interruptible: boolean;
}

/**
 * Bounds every Redis reply by the same time, `ms`, with one timer for all of them instead of a
 * timer per reply. Since every reply gets the same bound, the pending replies' deadlines come in
 * the order they were registered (a `LinkedList` keeps that order): the timer only ever waits for
 * the oldest, and a reply that comes in time costs linking and unlinking one entry.
 */
export class ReplyDeadlines {
  private readonly pending = new LinkedList<Pending>();
  private timer: NodeJS.Timeout | undefined;

  constructor(private readonly ms: number) {}

  /**
   * Settles like `promise`, unless `ms` pass first (rejects with `DEADLINE`), `signal` aborts
   * (rejects with its reason) or, if `interruptible`, `interrupt()` is called (rejects with its
   * reason). `fail`, if given, turns every rejection reason into the error to reject with (one
   * promise per reply, where a wrapper around this one would add another).
   */
  bound<T>(
    promise: Promise<T>,
    signal?: AbortSignal,
    interruptible = false,
    fail?: (reason: unknown) => Error,
  ): Promise<T> {
    if (signal?.aborted) {
      return abandon(promise, fail ? fail(signal.reason) : (signal.reason as Error));
    }
    return new Promise<T>((resolve, reject) => {
      let stopWatching: (() => void) | undefined;
      const entry: Pending = {
        due: performance.now() + this.ms,
        interruptible,
        reject: (reason) => {
          if (!this.pending.remove(entry)) return;
          stopWatching?.();
          reject(fail ? fail(reason) : (reason as Error));
        },
        prev: undefined,
        next: undefined,
      };
      this.pending.push(entry);
      this.timer ??= this.arm(this.ms);
      if (signal) stopWatching = onAbort(signal, entry.reject);
      promise.then(
        (value) => {
          if (!this.pending.remove(entry)) return;
          stopWatching?.();
          resolve(value);
        },
        (error: unknown) => entry.reject(error as Error),
      );
    });
  }

  /** Rejects every pending interruptible reply with `reason` now. */
  interrupt(reason: Error): void {
    for (const entry of this.pending.toArray()) if (entry.interruptible) entry.reject(reason);
  }

  private arm(delay: number): NodeJS.Timeout {
    // Unreferenced: a pending reply keeps the process alive through its socket, not this timer,
    // and once nothing is pending the timer is not armed again.
    return setTimeout(this.expire, delay).unref();
  }

  private readonly expire = (): void => {
    this.timer = undefined;
    const now = performance.now();
    for (let entry = this.pending.oldest; entry; entry = this.pending.oldest) {
      if (entry.due > now) {
        this.timer = this.arm(entry.due - now);
        return;
      }
      entry.reject(DEADLINE);
    }
  };
}
