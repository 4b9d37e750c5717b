import {
  LockBackendError,
  LockQuorumError,
  LockReplicationError,
  quoteKey,
  type KeyView,
  type LockOperation,
} from '../errors/redis-lock.errors.js';
import type { LockBackend } from '../interfaces/lock-backend.interface.js';
import { InFlight } from '../utils/in-flight.js';
import { ReplyDeadlines } from '../utils/reply-deadlines.js';
import { DEADLINE } from '../utils/within.js';

/**
 * Every Redis reply the engine waits for: bounded by `commandTimeout` (one timer for all, see
 * `ReplyDeadlines`), its failures mapped to `LockBackendError` naming the operation, and the
 * undos of grants that came after their attempt was given up, which shutdown waits for.
 */
export class Replies {
  private readonly deadlines: ReplyDeadlines;
  /** Undos in flight (see `undoing()`), each tagged with a key whose lock it gives back. */
  private readonly undos = new InFlight<string>();

  constructor(
    private readonly backend: LockBackend,
    private readonly commandTimeout: number,
    /** Aborts when shutdown begins: its reason passes through `failure()` unchanged. */
    private readonly stopping: AbortSignal,
    /** How keys are shown in messages (the module's `logKeys`). */
    private readonly view: KeyView,
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
    keys: readonly string[],
    failure: unknown,
    pending: Promise<T>,
    undo: (late: T) => Promise<unknown> | undefined,
  ): void {
    if (failure instanceof LockBackendError && !failure.timedOut) return;
    this.undoing(keys, pending.then(undo));
  }

  /**
   * Follows an undo sent on its own (a late grant's release, of `keys`): shutdown waits for it
   * before it closes the connections, since a release queued behind their QUIT would never run,
   * and an attempt that finds one of `keys` held waits for it (see `undosOf`). A failure is
   * dropped: there was nothing to undo, or the lock expires after its TTL.
   */
  undoing(keys: readonly string[], undo: Promise<unknown>): void {
    for (const key of keys) void this.undos.track(undo, key);
  }

  /**
   * Settles when the undos in flight on `key` have (`undefined` if there are none): until then
   * the key may be held by this process's own abandoned attempt.
   */
  undosOf(key: string): Promise<unknown> | undefined {
    return this.undos.of(key);
  }

  /** Shutdown, first step: rejects every pending acquisition reply with `reason`. */
  interrupt(reason: Error): void {
    this.deadlines.interrupt(reason);
  }

  /**
   * Shutdown: settles when the undos in flight have, or at `deadline` (`performance.now()`), with
   * the keys of those still waiting for their attempt's reply or their own.
   */
  async undone(deadline: number): Promise<string[]> {
    return [...new Set(await this.undos.drain(deadline))];
  }

  /** What `reply()` rejects with when `error` ended the wait (see `reply`). */
  failure(
    key: string,
    operation: LockOperation,
    signal: AbortSignal | undefined,
    error: unknown,
  ): Error {
    if (error === DEADLINE) {
      const down = this.backend.unreachable?.();
      const silence = new Error(
        (this.backend.replyTimeout === this.commandTimeout
          ? `no reply within commandTimeout (${this.commandTimeout} ms)`
          : `no answer within ${this.backend.replyTimeout} ms (Redlock: two rounds of commandTimeout)`) +
          (down ? `: ${down}` : ''),
      );
      return new LockBackendError(key, operation, silence, true, this.view);
    }
    if (error instanceof LockReplicationError && this.view !== quoteKey) {
      // Made by the Redis layer, which shows keys plainly.
      const { key, replicas, acknowledged, timeout } = error;
      return new LockReplicationError(
        key,
        error.operation as 'acquire' | 'extend',
        replicas,
        acknowledged,
        timeout,
        this.view,
      );
    }
    if (
      error === this.stopping.reason ||
      (signal?.aborted && error === signal.reason) ||
      error instanceof LockBackendError
    ) {
      return error as Error;
    }
    // In Redlock mode, a round a silent node left undecided did not answer in time either; nor
    // did a reply the module's own shutdown cut off (see `cutOffByShutdown`).
    const silent =
      (error instanceof LockQuorumError && error.timedOut) ||
      (this.stopping.aborted && cutOffByShutdown(error));
    const cause = this.backend.explain?.(error) ?? error;
    quietCommands(cause);
    return new LockBackendError(key, operation, cause, silent, this.view);
  }
}

/** What ioredis rejects a command with whose connection was closed before its reply came. */
const CLOSED = 'Connection is closed.';

/**
 * Whether `error` is a reply that never came because the connection was closed under it (on every
 * node that failed, in Redlock mode): during shutdown, that is the module's own closing, at its
 * deadline, or at once for a connection that was not ready: the call had no reply in time.
 */
function cutOffByShutdown(error: unknown): boolean {
  if (error instanceof LockQuorumError) {
    return error.failures.length > 0 && error.failures.every((failure) => failure.endsWith(CLOSED));
  }
  return error instanceof Error && error.message === CLOSED;
}

/**
 * ioredis puts the command a reply error answers on the error (`command: { name, args }`): the
 * lock's key and owner token among the args. Made not enumerable along the cause chain, so that
 * a logger that inspects the error deeply (Nest's console logger does) prints neither; code can
 * still read it.
 */
function quietCommands(error: unknown): void {
  for (let depth = 0; depth < 5 && error instanceof Error; depth++) {
    if (Object.prototype.propertyIsEnumerable.call(error, 'command')) {
      Object.defineProperty(error, 'command', { enumerable: false });
    }
    error = error.cause;
  }
}
