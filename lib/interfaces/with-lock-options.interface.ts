import type { ExecutionContext } from '@nestjs/common';
import type { LockAcquireTimeoutError } from '../errors/redis-lock.errors.js';
import type { AcquireOptions } from './lock.interface.js';

/** Builds the error a `@WithLock` handler throws when its lock was not acquired in time. */
export type LockTimeoutExceptionFactory = (
  error: LockAcquireTimeoutError,
  context: ExecutionContext,
) => unknown;

/**
 * How `@WithLock` handlers (controllers, microservice and WebSocket handlers) answer when the lock
 * was not acquired within `acquireTimeout`. Settable on the module and on each decorator; the
 * decorator's wins. Give at most one of the two at each level.
 */
export interface LockTimeoutResponse {
  /**
   * HTTP status of the answer, with a `Retry-After` header. Microservice handlers get an
   * `RpcException` and WebSocket handlers a `WsException` instead.
   * @default 409
   */
  timeoutStatus?: number;
  /** Builds the error to throw instead, for every transport (no `Retry-After` header is added). */
  timeoutException?: LockTimeoutExceptionFactory;
}

/** A key for `@WithLock`: a template over the method's arguments, or a function of them. */
export type LockKeySource = string | ((...args: never[]) => string);

/** Options of `@WithLock`. Unset durations take the module's `defaults`. */
export interface WithLockOptions
  extends
    Pick<
      AcquireOptions,
      'ttl' | 'acquireTimeout' | 'autoExtend' | 'limit' | 'mode' | 'fair' | 'holdAtLeast'
    >,
    LockTimeoutResponse {
  /**
   * The lock key, built from the method's own arguments (after pipes, on controllers):
   * a template where `{N}` is the N-th argument and `{N.a.b}` a property path in it, or a
   * function of the arguments. An array of them locks every key, all or none (see
   * `LockService.acquire`).
   * @example 'order:{0}'
   * @example '{1.tenant}:invoice:{0}'
   * @example (sku: string) => `sku:${sku}`
   * @example ['acct:{0.from}', 'acct:{0.to}']
   */
  key: LockKeySource | readonly LockKeySource[];
  /**
   * Longest key this method may lock, in characters: a longer one is a `LockKeyResolutionError`
   * (a route answers 400) before any lock is taken. At most the module's `maxKeyLength`, which
   * applies when this is not set.
   */
  maxKeyLength?: number;
  /**
   * Checks each key built for a call (after encoding) before any lock is taken: return `true` to
   * accept it; anything else is a `LockKeyResolutionError` (a route answers 400). Throw your own
   * error to answer otherwise. For an allow-list of resources a pipe cannot express.
   * @example (key) => /^order:\d{1,12}$/.test(key)
   */
  validateKey?: (key: string, args: readonly unknown[]) => boolean;
  /**
   * What a call does when another holder has the key. `'fail'`: it fails as any lock timeout does
   * (409, `RpcException`, `WsException`, `LockAcquireTimeoutError`). `'skip'`: the method is not
   * run and the call resolves `undefined` (an Observable method completes empty), for jobs that
   * must run once across instances (`@Cron`); `acquireTimeout` then defaults to 0. A Redis that
   * does not answer is not busy: the call still fails with `LockBackendError`.
   * @default 'fail'
   */
  onBusy?: 'fail' | 'skip';
}
