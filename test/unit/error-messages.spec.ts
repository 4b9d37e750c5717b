/**
 * Keys in messages: every error that names a key shows it JSON-quoted and cut at 100 characters,
 * so a key from a request (a line break, a forged `[Nest] …` line, a 95 kB body) cannot forge a
 * log line or flood one.
 */
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import {
  LeadershipStoppedError,
  LockAcquireAbortedError,
  LockAcquireTimeoutError,
  LockArgumentError,
  LockBackendError,
  LockLostError,
  RedisLockShutdownError,
} from '../../lib/index.js';
import { lockOrder } from '../../lib/options/checks.js';

const FORGED = 'order:1\r\n[Nest] 1  - 11/27/2026  LOG [AuthService] user admin logged in';
const LONG = `order:${'x'.repeat(95_000)}`;

const messages = (key: string): string[] => [
  new LockAcquireTimeoutError(key, 10, 10).message,
  new LockLostError(key, 'token', 'not-held').message,
  new LockAcquireAbortedError(key, 'stop').message,
  new RedisLockShutdownError(key).message,
  new LeadershipStoppedError(key, 'stop').message,
  new LeadershipStoppedError(key, 'shutdown').message,
  new LockBackendError(key, 'acquire', new Error('down')).message,
  ((): string => {
    try {
      lockOrder([key, key]);
    } catch (error) {
      return (error as LockArgumentError).message;
    }
    return 'no error';
  })(),
];

describe('keys in error messages', () => {
  it('are JSON-quoted: a line break in a key cannot start a log line of its own', () => {
    for (const message of messages(FORGED)) {
      assert.doesNotMatch(message, /[\r\n]/, message);
      assert.ok(message.includes(JSON.stringify(FORGED)), message);
    }
  });

  it('are cut at 100 characters, with the length', () => {
    for (const message of messages(LONG)) {
      assert.ok(message.length < 700, `${message.length} characters`);
      assert.ok(
        message.includes(`"${LONG.slice(0, 100)}…" (95006 characters)`),
        message.slice(0, 200),
      );
    }
  });

  it('a short key reads as before', () => {
    assert.match(messages('order:42')[0], /^Could not acquire lock "order:42" within 10 ms/);
  });
});
