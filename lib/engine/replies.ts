import { LockBackendError, type LockOperation } from '../errors/redis-lock.errors.js';
import type { LockBackend } from '../interfaces/lock-backend.interface.js';
import { ReplyDeadlines } from '../utils/reply-deadlines.js';
import { DEADLINE, ignoreDeadline, within } from '../utils/within.js';

/**
 * Every Redis reply the engine waits for: bounded by `commandTimeout` (one timer for all, see
 * `ReplyDeadlines`), its failures mapped to `LockBackendError` naming the operation, and the
 * undos of grants that came after their attempt was given up, which shutdown waits for.
 */
export class Replies {
  private readonly deadlines: ReplyDeadlines;
  /** Undos in flight (see `undoing()`). */
  private readonly undos = new Set<Promise<unknown>>();

  constructor(
    private readonly backend: LockBackend,
    private readonly commandTimeout: number,
    /** Aborts when shutdown begins: its reason passes through `failure()` unchanged. */
    private readonly stopping: AbortSignal,
  ) {
    this.deadlines = new ReplyDeadlines(backend.replyTimeout);
  }

  /**
   * Waits for one Redis reply for at most `commandTimeout`, or until `signal` aborts or, for an
   * `interruptible` one (an acquisition attempt), shutdown begins: then it rejects with the abort
   * reason. Every other failure becomes a `LockBackendError` naming the operation; a reply that
   * never comes is one with `timedOut: true`.
   */
  reply<T>(
    key: string,
    operation: LockOperation,
    pending: Promise<T>,
    signal?: AbortSignal,
    interruptible = false,
  ): Promise<T> {
    return this.deadlines.bound(pending, signal, interruptible, (error) =>
      this.failure(key, operation, signal, error),
    );
  }

  /**
   * An acquisition's reply: as `reply()`, interruptible by shutdown, with `fail` making the error
   * to reject with (see `failure()`, and `undoLateGrant()` for a grant that may still come).
   */
  acquisition<T>(
    pending: Promise<T>,
    signal: AbortSignal | undefined,
    fail: (error: unknown) => Error,
  ): Promise<T> {
    return this.deadlines.bound(pending, signal, true, fail);
  }

  /**
   * After an acquisition's reply was given up (no reply in time, or aborted; not when Redis
   * answered with an error: `failure`), a grant that arrives later is undone, so an abandoned
   * attempt never leaves a lock behind.
   */
  undoLateGrant<T>(
    failure: unknown,
    pending: Promise<T>,
    undo: (late: T) => Promise<unknown> | undefined,
  ): void {
    if (failure instanceof LockBackendError && !failure.timedOut) return;
    this.undoing(pending.then(undo));
  }

  /**
   * Follows an undo sent on its own (a late grant's release): shutdown waits for it before it
   * closes the connections, since a release queued behind their QUIT would never run. A failure
   * is dropped: there was nothing to undo, or the lock expires after its TTL.
   */
  undoing(undo: Promise<unknown>): void {
    const forget = (): void => void this.undos.delete(settled);
    const settled: Promise<void> = undo.then(forget, forget);
    this.undos.add(settled);
  }

  /**
   * Shutdown: rejects every pending acquisition reply with `reason`, then waits for the undos in
   * flight, no longer than an attempt's reply and a release take.
   */
  async interrupt(reason: Error): Promise<void> {
    this.deadlines.interrupt(reason);
    await within(Promise.all(this.undos), 2 * this.commandTimeout, []).catch(ignoreDeadline);
  }

  /** What `reply()` rejects with when `error` ended the wait (see `reply`). */
  failure(
    key: string,
    operation: LockOperation,
    signal: AbortSignal | undefined,
    error: unknown,
  ): Error {
    if (error === DEADLINE) {
      const silence = new Error(
        this.backend.replyTimeout === this.commandTimeout
          ? `no reply within commandTimeout (${this.commandTimeout} ms)`
          : `no answer within ${this.backend.replyTimeout} ms (Redlock: two rounds of commandTimeout)`,
      );
      return new LockBackendError(key, operation, silence, true);
    }
    if (
      error === this.stopping.reason ||
      (signal?.aborted && error === signal.reason) ||
      error instanceof LockBackendError
    ) {
      return error as Error;
    }
    return new LockBackendError(key, operation, error);
  }
}
