/** `@WithLock` options: checked when the decorator is applied (when the class is defined). */

import { LockArgumentError, RedisLockConfigurationError } from '../errors/redis-lock.errors.js';
import type { WithLockOptions } from '../interfaces/with-lock-options.interface.js';
import {
  TIMEOUT_RESPONSE_KEYS,
  checkTimeoutResponse,
  durationProblem,
  holdAtLeastProblem,
  isOptionsObject,
  keyLengthProblem,
  lockShape,
  rejectUnknownKeys,
  ttlProblem,
} from './checks.js';

const WITH_LOCK_KEYS = [
  'key',
  'maxKeyLength',
  'validateKey',
  'onBusy',
  'holdAtLeast',
  'ttl',
  'acquireTimeout',
  'autoExtend',
  'limit',
  'mode',
  'fair',
  ...TIMEOUT_RESPONSE_KEYS,
];

/**
 * Validates `@WithLock` options when the decorator is applied. Throws
 * `RedisLockConfigurationError` naming `@WithLock(Class.method).option`. The key is checked by
 * the key compiler.
 */
export function validateWithLockOptions(options: WithLockOptions, method: string): void {
  const path = `@WithLock(${method}).`;
  const fail = (option: string, value: unknown, problem: string): never => {
    throw new RedisLockConfigurationError(option, value, problem);
  };
  if (!isOptionsObject(options)) {
    fail(`@WithLock(${method})`, options, "pass an object such as { key: 'order:{0}' }");
  }
  rejectUnknownKeys(options, WITH_LOCK_KEYS, path, fail);
  for (const name of ['ttl', 'acquireTimeout'] as const) {
    const value = options[name];
    const problem =
      value === undefined
        ? undefined
        : name === 'ttl'
          ? ttlProblem(value)
          : durationProblem(value, true);
    if (problem) fail(`${path}${name}`, value, problem);
  }
  if (options.maxKeyLength !== undefined) {
    const problem = keyLengthProblem(options.maxKeyLength);
    if (problem) fail(`${path}maxKeyLength`, options.maxKeyLength, problem);
  }
  if (options.validateKey !== undefined && typeof options.validateKey !== 'function') {
    fail(
      `${path}validateKey`,
      options.validateKey,
      'must be a function of (key, args) returning true to accept the key',
    );
  }
  if (options.autoExtend !== undefined && typeof options.autoExtend !== 'boolean') {
    fail(`${path}autoExtend`, options.autoExtend, 'must be true or false');
  }
  try {
    lockShape(options.limit, options.mode, options.fair);
  } catch (error) {
    if (!(error instanceof LockArgumentError)) throw error;
    fail(`${path}${error.argument}`, error.value, error.problem);
  }
  checkTimeoutResponse(options, path, fail);
  if (options.holdAtLeast !== undefined) {
    const shape = lockShape(options.limit, options.mode, options.fair);
    const problem = holdAtLeastProblem(options.holdAtLeast, options.ttl, shape);
    if (problem) fail(`${path}${problem[0]}`, options.holdAtLeast, problem[1]);
  }
  const { onBusy } = options;
  if (onBusy !== undefined && onBusy !== 'fail' && onBusy !== 'skip') {
    fail(`${path}onBusy`, onBusy, "must be 'fail' or 'skip'");
  }
  if (onBusy === 'skip' && (options.timeoutStatus ?? options.timeoutException) !== undefined) {
    fail(
      `${path}onBusy + ${path}${options.timeoutStatus === undefined ? 'timeoutException' : 'timeoutStatus'}`,
      onBusy,
      "a call that skips never answers a lock timeout: give onBusy: 'skip' or a timeout answer, not both",
    );
  }
}
