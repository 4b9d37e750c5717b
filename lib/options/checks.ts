/** The checks every kind of option shares: durations, keys, lock shapes, option objects. */

import type { Cluster, Redis } from 'ioredis';
import { LockArgumentError, quoteKey, type KeyView } from '../errors/redis-lock.errors.js';
import type { LockShape } from '../interfaces/lock-backend.interface.js';
import type { LockTimeoutResponse } from '../interfaces/with-lock-options.interface.js';
import { DEFAULTS_KEYS, MAX_DURATION } from './defaults.js';

/** The plain, exclusive lock (a writer). */
export const PLAIN: LockShape = Object.freeze({ limit: 1, mode: 'write', fair: false });

const READ: LockShape = Object.freeze({ limit: 1, mode: 'read', fair: false });

const FAIR: LockShape = Object.freeze({ limit: 1, mode: 'write', fair: true });

/** The most holders a counting semaphore may admit (a Redis sorted set holds them all). */
const MAX_LIMIT = 1_000_000;

/**
 * The shape `limit`, `mode` and `fair` ask for; a `LockArgumentError` for a bad value or a
 * combination that does not exist (naming both options).
 */
export function lockShape(
  limit: unknown = 1,
  mode: unknown = 'write',
  fair: unknown = false,
): LockShape {
  if (typeof limit !== 'number' || !Number.isInteger(limit) || limit < 1 || limit > MAX_LIMIT) {
    throw new LockArgumentError('limit', limit, `must be a whole number from 1 to ${MAX_LIMIT}`);
  }
  if (mode !== 'write' && mode !== 'read') {
    throw new LockArgumentError('mode', mode, "must be 'write' or 'read'");
  }
  if (mode === 'read' && limit > 1) {
    throw new LockArgumentError(
      'mode + limit',
      { mode, limit },
      'a read lock admits any number of readers: give mode or limit, not both',
    );
  }
  if (typeof fair !== 'boolean') throw new LockArgumentError('fair', fair, 'must be true or false');
  if (fair && (limit > 1 || mode === 'read')) {
    const [other, value] = limit > 1 ? ['limit', limit] : ['mode', mode];
    throw new LockArgumentError(
      `fair + ${other}`,
      { fair, [other]: value },
      'fair queues exclusive locks only: not with a semaphore or a read lock',
    );
  }
  if (fair) return FAIR;
  if (mode === 'read') return READ;
  return limit === 1 ? PLAIN : Object.freeze({ limit, mode: 'write', fair: false });
}

/**
 * The shortest TTL, in ms. A lock's lease is its TTL less 1 % and 2 ms, counted from when its
 * command was sent: a shorter TTL would leave next to nothing, and a grant arriving after it is not
 * a lock (see `AcquireLoop.obtain`).
 */
const MIN_TTL = 10;

/** What is wrong with `value` as a lock's TTL, if anything. */
export function ttlProblem(value: unknown): string | undefined {
  const problem = durationProblem(value, false);
  if (problem || (value as number) >= MIN_TTL) return problem;
  return `must be at least ${MIN_TTL} ms: a lock's lease is its TTL less 1 % and 2 ms, so a shorter one would be over before its grant arrived`;
}

/**
 * Says what is wrong with a duration, or `undefined` if it is fine. Durations are whole
 * milliseconds, finite, > 0 (or >= 0 where `allowZero`), and fit a Node timer.
 */
export function durationProblem(value: unknown, allowZero: boolean): string | undefined {
  const floor = allowZero ? '>= 0' : '> 0';
  if (typeof value !== 'number' || !Number.isFinite(value) || !Number.isInteger(value)) {
    const hint =
      typeof value === 'string' && value.trim() !== '' && Number.isFinite(Number(value))
        ? ' (this is a string: values read from the environment or a ConfigService are strings; convert them with Number(...))'
        : '';
    return `must be a whole number of milliseconds ${floor}${hint}`;
  }
  if (allowZero ? value < 0 : value <= 0) return `must be ${floor}`;
  if (value > MAX_DURATION) return `must be at most ${MAX_DURATION} ms (~24.8 days)`;
  return undefined;
}

/**
 * What is wrong with `holdAtLeast` for a lock of `ttl` and `shape` (the option at fault, naming
 * both where a combination is), or `undefined`.
 */
export function holdAtLeastProblem(
  value: unknown,
  ttl: number | undefined,
  shape: LockShape,
): [string, string] | undefined {
  const problem = durationProblem(value, true);
  if (problem) return ['holdAtLeast', problem];
  if (ttl !== undefined && (value as number) > ttl) {
    return ['holdAtLeast', `must not exceed the ttl (${ttl} ms): the key cannot outlive its TTL`];
  }
  if ((value as number) > 0 && (shape.limit !== 1 || shape.mode !== 'write' || shape.fair)) {
    const other = shape.mode === 'read' ? 'mode' : shape.fair ? 'fair' : 'limit';
    return [
      `holdAtLeast + ${other}`,
      'holdAtLeast keeps an exclusive key taken after its release: plain locks only (not with limit, mode or fair)',
    ];
  }
  return undefined;
}

export const TIMEOUT_RESPONSE_KEYS = ['timeoutStatus', 'timeoutException'];

export function checkTimeoutResponse(
  given: LockTimeoutResponse,
  path: string,
  fail: (option: string, value: unknown, problem: string) => never,
): LockTimeoutResponse {
  const { timeoutStatus, timeoutException } = given;
  if (timeoutStatus !== undefined && timeoutException !== undefined) {
    fail(`${path}timeoutStatus + ${path}timeoutException`, undefined, 'give one of them, not both');
  }
  if (
    timeoutStatus !== undefined &&
    (typeof timeoutStatus !== 'number' ||
      !Number.isInteger(timeoutStatus) ||
      timeoutStatus < 400 ||
      timeoutStatus > 599)
  ) {
    fail(
      `${path}timeoutStatus`,
      timeoutStatus,
      'must be an HTTP error status from 400 to 599, such as 409, 423 or 503',
    );
  }
  if (timeoutException !== undefined && typeof timeoutException !== 'function') {
    fail(
      `${path}timeoutException`,
      timeoutException,
      'must be a function (error, context) => the error to throw',
    );
  }
  return { timeoutStatus, timeoutException };
}

/**
 * Throws `LockArgumentError` unless `key` is a non-empty, well-formed Unicode string of at most
 * `maxLength` characters (the module's `maxKeyLength`). A lone surrogate has no UTF-8 form: Redis
 * would receive U+FFFD for it, so two different keys would share one lock.
 */
export function assertKey(key: unknown, rules: KeyRules = NO_KEY_RULES): asserts key is string {
  if (typeof key !== 'string' || key.length === 0) {
    throw new LockArgumentError('key', key, 'must be a non-empty string');
  }
  if (!isWellFormed(key)) {
    throw new LockArgumentError(
      'key',
      key,
      'must be well-formed Unicode (it contains a lone UTF-16 surrogate, which has no UTF-8 form)',
      rules.keyView,
    );
  }
  if (key.length > rules.maxKeyLength) {
    throw new LockArgumentError('key', key, tooLong(key.length, rules.maxKeyLength), rules.keyView);
  }
}

/** What every key is held to: the module's `maxKeyLength`, and how its messages show keys. */
export interface KeyRules {
  readonly maxKeyLength: number;
  readonly keyView?: KeyView;
}

const NO_KEY_RULES: KeyRules = { maxKeyLength: Infinity };

/** What is wrong with a `maxKeyLength`, or `undefined`: a whole number of characters, at least 1. */
export function keyLengthProblem(value: unknown): string | undefined {
  return typeof value === 'number' && Number.isSafeInteger(value) && value >= 1
    ? undefined
    : 'must be a whole number of characters, at least 1';
}

/** What a key longer than `maxKeyLength` is told. */
function tooLong(length: number, maxLength: number): string {
  return `is ${length} characters long, more than maxKeyLength (${maxLength}): a key names a resource, it does not carry data (hash long input into the key, or raise maxKeyLength)`;
}

/** Whether `text` has no lone UTF-16 surrogate, i.e. has a UTF-8 form. */
export function isWellFormed(text: string): boolean {
  return (text as unknown as WellFormed).isWellFormed();
}

/** The longest owner token a caller may give, in UTF-16 code units (a generated one has 32). */
const MAX_TOKEN_LENGTH = 256;

/**
 * What is wrong with a caller's own `token`, or `undefined`: it must be a non-empty, well-formed
 * string (a lone surrogate reaches Redis as U+FFFD, so two different tokens would hold one lock)
 * of at most `MAX_TOKEN_LENGTH` characters (it is stored with every lock and sent with every
 * extension and release).
 */
export function tokenProblem(token: unknown): string | undefined {
  if (typeof token !== 'string' || token.length === 0) return 'must be a non-empty string';
  if (!isWellFormed(token)) {
    return 'must be well-formed Unicode (it contains a lone UTF-16 surrogate, which has no UTF-8 form: two tokens would become one in Redis)';
  }
  if (token.length > MAX_TOKEN_LENGTH) {
    return `must be at most ${MAX_TOKEN_LENGTH} characters (a generated token has 32)`;
  }
  return undefined;
}

/**
 * The keys of a multi-key lock in the order they are locked: each checked as a key, none twice,
 * sorted by UTF-16 code units — one order for every caller and process, whatever order each
 * names them in.
 */
export function lockOrder(keys: readonly unknown[], rules: KeyRules = NO_KEY_RULES): string[] {
  if (keys.length === 0) {
    throw new LockArgumentError(
      'key',
      keys,
      'must be a non-empty string or a non-empty array of them',
    );
  }
  const seen = new Set<string>();
  for (const key of keys) {
    assertKey(key, rules);
    if (seen.has(key)) {
      const shown = (rules.keyView ?? quoteKey)(key);
      throw new LockArgumentError('key', keys, `names ${shown} twice: list each key once`);
    }
    seen.add(key);
  }
  return [...seen].sort();
}

/** `String.prototype.isWellFormed` (Node 20), which the ES2022 library typings do not declare yet. */
interface WellFormed {
  isWellFormed(): boolean;
}

/** An object of named options: not null, not an array (whose elements would be taken as none). */
export function isOptionsObject(value: unknown): value is object {
  return typeof value === 'object' && value !== null && !Array.isArray(value);
}

export function rejectUnknownKeys(
  object: object,
  known: readonly string[],
  path: string,
  fail: (name: string, value: unknown, problem: string) => never,
): void {
  for (const name of Object.keys(object)) {
    if (!known.includes(name)) {
      const near = closest(name, known);
      const hint =
        path === '' && DEFAULTS_KEYS.includes(name)
          ? ` (did you mean the module option defaults.${name}?)`
          : near !== undefined
            ? ` (did you mean ${path}${near}?)`
            : '';
      fail(
        `${path}${name}`,
        (object as Record<string, unknown>)[name],
        `unknown option${hint}; known: ${known.join(', ')}`,
      );
    }
  }
}

/**
 * The known name a mistyped one most likely meant: the same name in another case, or the nearest
 * within two edits (insertions, deletions, substitutions), if exactly one is that near.
 */
function closest(name: string, known: readonly string[]): string | undefined {
  const sameCase = known.find((candidate) => candidate.toLowerCase() === name.toLowerCase());
  if (sameCase !== undefined) return sameCase;
  const near = known.filter((candidate) => editDistance(name, candidate) <= 2);
  return near.length === 1 ? near[0] : undefined;
}

/** Levenshtein distance, one row at a time. */
function editDistance(a: string, b: string): number {
  let previous = Array.from({ length: b.length + 1 }, (_, j) => j);
  for (let i = 1; i <= a.length; i++) {
    const row = [i];
    for (let j = 1; j <= b.length; j++) {
      row[j] = Math.min(
        previous[j] + 1,
        row[j - 1] + 1,
        previous[j - 1] + (a[i - 1] === b[j - 1] ? 0 : 1),
      );
    }
    previous = row;
  }
  return previous[b.length];
}

export function isRedisClient(value: unknown): value is Redis | Cluster {
  // Duck-typed so that a client from another copy of ioredis (a different version in the
  // app's node_modules) is still accepted.
  return (
    typeof value === 'object' &&
    value !== null &&
    typeof (value as Redis).defineCommand === 'function' &&
    typeof (value as Redis).duplicate === 'function'
  );
}
