/** A lock call's options (`acquire`, `tryAcquire`, `using`, `lead`): checked once per call. */

import { LockArgumentError } from '../errors/redis-lock.errors.js';
import type { AcquireOptions } from '../interfaces/lock.interface.js';
import type { LockShape } from '../interfaces/lock-backend.interface.js';
import {
  PLAIN,
  assertKey,
  durationProblem,
  holdAtLeastProblem,
  isOptionsObject,
  isWellFormed,
  lockShape,
  rejectUnknownKeys,
  tokenProblem,
  ttlProblem,
} from './checks.js';
import { ResolvedDefaults } from './defaults.js';

/** What a lock call runs with, once defaults are applied and everything is checked. */
export interface ResolvedAcquireOptions {
  ttl: number;
  acquireTimeout: number;
  autoExtend: boolean;
  signal: AbortSignal | undefined;
  token: string | undefined;
  /** What is taken: `PLAIN` unless `limit` or `mode` say otherwise. */
  shape: LockShape;
  /** See `AcquireOptions.holdAtLeast` (0: none). */
  holdAtLeast: number;
  /** `@WithLock({ onBusy: 'skip' })`: a call another holder kept out is `skipped`, not a `timeout`. */
  skipWhenBusy: boolean;
  /** Whether its wait counts among `maxWaiters` (see `NOT_COUNTED`). */
  counted: boolean;
}

/**
 * @internal The option `@WithLock({ onBusy: 'skip' })` passes with its calls (a symbol: no user
 * option can name it, and the check of option names does not see it).
 */
export const SKIP_WHEN_BUSY = Symbol('nestjs-redis-lock:skip-when-busy');

/**
 * @internal The option a leader's campaign passes with its waits: it is never refused by
 * `maxWaiters` (one per leadership, waiting for its turn; a refusal would have it ask again at
 * once, and so spin while a flood of other callers fills the limit).
 */
export const NOT_COUNTED = Symbol('nestjs-redis-lock:not-counted-in-max-waiters');

/**
 * @internal The option a leader's campaign passes with its terms: `using()` does not warn that the
 * lock was lost before the work finished, which the campaign reports itself as lost leadership.
 */
export const LOSS_REPORTED = Symbol('nestjs-redis-lock:loss-reported');

/** Which public method is asking: decides the `autoExtend` default and whether waiting is allowed. */
export type AcquireMode = 'acquire' | 'tryAcquire' | 'using';

const ACQUIRE_KEYS = [
  'ttl',
  'holdAtLeast',
  'acquireTimeout',
  'autoExtend',
  'signal',
  'token',
  'limit',
  'mode',
  'fair',
];

/** Validates one call's key and options and fills in the defaults. Throws `LockArgumentError`. */
export function resolveAcquireOptions(
  key: unknown,
  options: AcquireOptions | undefined,
  defaults: ResolvedDefaults,
  mode: AcquireMode,
): ResolvedAcquireOptions {
  assertKey(key, defaults);
  return resolveCallOptions(options, defaults, mode);
}

/**
 * Validates one call's options (its keys checked already, see `lockOrder`) and fills in the
 * defaults. Throws `LockArgumentError`.
 */
export function resolveCallOptions(
  options: AcquireOptions | undefined,
  defaults: ResolvedDefaults,
  mode: AcquireMode,
): ResolvedAcquireOptions {
  const fail = (argument: string, value: unknown, problem: string): never => {
    throw new LockArgumentError(argument, value, problem);
  };
  const opts = options === undefined ? {} : options;
  if (!isOptionsObject(opts)) fail('options', opts, 'must be an object');
  rejectUnknownKeys(opts, ACQUIRE_KEYS, '', fail);

  const ttl = opts.ttl === undefined ? defaults.ttl : opts.ttl;
  const problem = ttlProblem(ttl);
  if (problem) fail('ttl', ttl, problem);
  const givenTimeout =
    opts.acquireTimeout === undefined ? defaults.acquireTimeout : opts.acquireTimeout;
  const timeoutProblem = durationProblem(givenTimeout, true);
  if (timeoutProblem) fail('acquireTimeout', givenTimeout, timeoutProblem);
  // Checked above all the same: a bad value is an error even where it is not used.
  const acquireTimeout = mode === 'tryAcquire' ? 0 : givenTimeout;
  const autoExtend =
    opts.autoExtend === undefined ? (defaults.autoExtend ?? mode === 'using') : opts.autoExtend;
  if (typeof autoExtend !== 'boolean') fail('autoExtend', autoExtend, 'must be true or false');
  if (opts.signal !== undefined && !(opts.signal instanceof AbortSignal)) {
    fail('signal', opts.signal, 'must be an AbortSignal');
  }
  const badToken = opts.token === undefined ? undefined : tokenProblem(opts.token);
  if (badToken) fail('token', opts.token, badToken);
  const shape =
    opts.limit === undefined && opts.mode === undefined && opts.fair === undefined
      ? PLAIN
      : lockShape(opts.limit, opts.mode, opts.fair);
  const holdAtLeast = opts.holdAtLeast ?? 0;
  const holdProblem = holdAtLeastProblem(holdAtLeast, ttl, shape);
  if (holdProblem) fail(holdProblem[0], holdAtLeast, holdProblem[1]);
  return {
    ttl,
    acquireTimeout,
    autoExtend,
    signal: opts.signal,
    token: opts.token,
    shape,
    holdAtLeast,
    skipWhenBusy: (opts as { [SKIP_WHEN_BUSY]?: unknown })[SKIP_WHEN_BUSY] === true,
    counted: (opts as { [NOT_COUNTED]?: unknown })[NOT_COUNTED] !== true,
  };
}

/**
 * What is wrong with the options of `lead()` or `@WhileLeader` (`[option, value, problem]`), or
 * `undefined`.
 */
export function leadOptionsProblem(options: unknown): [string, unknown, string] | undefined {
  if (options === undefined) return undefined;
  const unknown = unknownOption(options, ['ttl', 'id'], 'a leadership');
  if (unknown) return unknown;
  const { ttl, id } = options as { ttl?: unknown; id?: unknown };
  const problem = ttl === undefined ? undefined : ttlProblem(ttl);
  if (problem) return ['ttl', ttl, problem];
  if (id === undefined) return undefined;
  if (typeof id !== 'string' || id.length === 0) return ['id', id, 'must be a non-empty string'];
  if (id.length > MAX_PARTICIPANT_ID) {
    return ['id', id, `must be at most ${MAX_PARTICIPANT_ID} characters`];
  }
  return isWellFormed(id) ? undefined : ['id', id, 'must be well-formed Unicode'];
}

/** The longest participant id of a leadership. */
const MAX_PARTICIPANT_ID = 200;

/** What is wrong with the options of `Leadership.elected()`, or `undefined`. */
export function electedOptionsProblem(options: unknown): [string, unknown, string] | undefined {
  if (options === undefined) return undefined;
  const unknown = unknownOption(options, ['timeout', 'signal'], 'elected()');
  if (unknown) return unknown;
  const { timeout, signal } = options as { timeout?: unknown; signal?: unknown };
  const problem = timeout === undefined ? undefined : durationProblem(timeout, true);
  if (problem) return ['timeout', timeout, problem];
  if (signal !== undefined && !(signal instanceof AbortSignal)) {
    return ['signal', signal, 'must be an AbortSignal'];
  }
  return undefined;
}

/** What is wrong with the options of `LockService.forceRelease()`, or `undefined`. */
export function forceReleaseOptionsProblem(
  options: unknown,
): [string, unknown, string] | undefined {
  const unknown = unknownOption(options, ['reason'], 'forceRelease()');
  if (unknown) return unknown;
  const { reason } = options as { reason?: unknown };
  if (typeof reason !== 'string' || reason.trim().length === 0) {
    return ['reason', reason, 'must be a non-empty string: say why the lock is freed, for the log'];
  }
  return undefined;
}

/** `options` not an object, or its first option not among `known` (of `what`), as a problem. */
function unknownOption(
  options: unknown,
  known: readonly string[],
  what: string,
): [string, unknown, string] | undefined {
  if (!isOptionsObject(options)) return ['options', options, 'must be an object'];
  for (const [name, value] of Object.entries(options)) {
    if (!known.includes(name)) {
      return [name, value, `is not an option of ${what} (only ${known.join(' and ')} are)`];
    }
  }
  return undefined;
}
