/**
 * Keys in messages: every error that names a key shows it JSON-quoted and cut at 100 characters,
 * so a key from a request (a line break, a forged `[Nest] …` line, a 95 kB body) cannot forge a
 * log line or flood one.
 */
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { inspect } from 'node:util';
import {
  LeadershipStoppedError,
  LockAcquireAbortedError,
  LockAcquireTimeoutError,
  LockArgumentError,
  LockBackendError,
  LockKeyResolutionError,
  LockLostError,
  LockQuorumError,
  LockReplicationError,
  RedisLockShutdownError,
} from '../../lib/index.js';
import { keyView, quoteKey, type KeyView } from '../../lib/errors/redis-lock.errors.js';
import { Replies } from '../../lib/engine/replies.js';
import { DEADLINE } from '../../lib/utils/within.js';
import type { LockBackend } from '../../lib/interfaces/lock-backend.interface.js';
import { lockOrder } from '../../lib/options/checks.js';

const FORGED = 'order:1\r\n[Nest] 1  - 11/27/2026  LOG [AuthService] user admin logged in';
const LONG = `order:${'x'.repeat(95_000)}`;

/** Every error that names a key, as the engine makes it with `view` (the module's `logKeys`). */
const errors = (key: string, view: KeyView = quoteKey): Error[] => {
  const replies = new Replies(
    { replyTimeout: 100 } as LockBackend,
    100,
    new AbortController().signal,
    view,
  );
  const stopping = new AbortController().signal;
  return [
    new LockAcquireTimeoutError(key, 10, 10, undefined, true, undefined, undefined, view),
    new LockLostError(key, 'token', 'not-held', { view }),
    new LockAcquireAbortedError(key, 'stop', view),
    new RedisLockShutdownError(key, view),
    new LeadershipStoppedError(key, 'stop', view),
    new LeadershipStoppedError(key, 'shutdown', view),
    replies.failure(key, 'acquire', stopping, new Error('down')),
    replies.failure(key, 'extend', stopping, new LockReplicationError(key, 'extend', 1, 0, 50)),
    ((): Error => {
      try {
        lockOrder([key, key], { maxKeyLength: Infinity, keyView: view });
      } catch (error) {
        return error as LockArgumentError;
      }
      return new Error('no error');
    })(),
  ];
};
const messages = (key: string): string[] => errors(key).map((error) => error.message);

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

  it('escape what JSON leaves but a log reader may take as a line break or a bend (U+2028, U+0085, U+202E)', () => {
    for (const char of ['\u2028', '\u2029', '\u0085', '\u007f', '\u202e', '\u200b']) {
      const key = `order:1${char}[Nest] 1  - LOG [Auth] admin logged in`;
      for (const message of messages(key)) {
        assert.ok(!message.includes(char), JSON.stringify(message));
        assert.ok(
          message.includes(`\\u${char.charCodeAt(0).toString(16).padStart(4, '0')}`),
          message,
        );
      }
    }
  });

  it('a short key reads as before', () => {
    assert.match(messages('order:42')[0], /^Could not acquire lock "order:42" within 10 ms/);
  });
});

describe("keys in error messages with logKeys 'hashed' or 'hidden'", () => {
  const key = 'cart:alice@example.com';
  for (const [mode, shown] of [
    ['hashed', 'key#'],
    ['hidden', '(key hidden)'],
  ] as const) {
    it(`${mode}: every message shows the key as the module does, and the error's key is not enumerable`, () => {
      const view = keyView(mode);
      const expected = view(key);
      assert.ok(expected.startsWith(shown), expected);
      for (const error of errors(key, view)) {
        assert.ok(error.message.includes(expected), error.message);
        assert.ok(!error.message.includes('alice'), error.message);
        if ('key' in error) {
          assert.equal(error.key, key);
          assert.ok(!Object.keys(error).includes('key'), `${error.name} lists its key`);
        }
      }
    });
  }

  it("an object a placeholder resolved to is counted, not named: its property names may come from the request ('plain' names them)", () => {
    const value = { 'alice@example.com': 1, role: 'admin' };
    const message = (view: ReturnType<typeof keyView>): string =>
      new LockKeyResolutionError(
        'Cart.add',
        'cart:{0}',
        '{0}',
        value,
        'unresolved',
        undefined,
        view,
      ).message;
    for (const mode of ['hashed', 'hidden'] as const) {
      const text = message(keyView(mode));
      assert.match(text, /resolved to an object with 2 properties\./);
      assert.ok(!text.includes('alice') && !text.includes('role'), text);
    }
    assert.match(message(keyView('plain')), /an object with "alice@example\.com", "role"/);
  });

  it("a replica's refusal made by the Redis layer (keys plainly) is shown the module's way, its counts kept", () => {
    const plain = new LockReplicationError(key, 'extend', 2, 1, 50);
    const replies = new Replies(
      { replyTimeout: 100 } as LockBackend,
      100,
      new AbortController().signal,
      keyView('hashed'),
    );
    const mapped = replies.failure(key, 'extend', undefined, plain);
    assert.ok(mapped instanceof LockReplicationError, String(mapped));
    assert.deepEqual(
      [mapped.operation, mapped.replicas, mapped.acknowledged, mapped.timeout, mapped.timedOut],
      ['extend', 2, 1, 50, false],
    );
    assert.ok(!mapped.message.includes('alice'), mapped.message);
    assert.match(
      mapped.message,
      /1 of 2 replicas confirmed the write within replicaAck\.timeout \(50 ms\)/,
    );
  });

  it('hashed: the first 16 hex digits of SHA-256, the same for the same key', () => {
    assert.equal(keyView('hashed')(key), 'key#40da1e25f8d85145');
    assert.equal(keyView('hashed')(key), keyView('hashed')(key));
    assert.notEqual(keyView('hashed')(`${key}.`), keyView('hashed')(key));
  });
});

describe("a Redis reply error's command (key and owner token among its args)", () => {
  const replies = new Replies(
    { replyTimeout: 100 } as LockBackend,
    100,
    new AbortController().signal,
    quoteKey,
  );

  it('is kept off the printed error along its cause chain, and still there for code to read', () => {
    const command = { name: 'evalsha', args: ['sha', '3', 'lock:{secret}', 'owner-token-1234'] };
    const reply = Object.assign(new Error('ERR something'), { command });
    const wrapped = new Error('the call failed', { cause: reply });
    const outer = Object.assign(new Error('a round failed', { cause: wrapped }), { command });
    const mapped = replies.failure('k', 'acquire', undefined, outer);
    const printed = inspect(mapped, { depth: 10 });
    assert.ok(!printed.includes('owner-token-1234'), printed);
    for (const error of [outer, reply]) {
      assert.equal(Object.keys(error).includes('command'), false);
      assert.deepEqual((error as Error & { command: unknown }).command, command);
    }
  });

  it('is kept off along a cause chain that loops, in bounded time (the walk stops at a depth of 5)', () => {
    const command = { name: 'evalsha', args: ['sha', '1', 'lock:{secret}', 'owner-token-1234'] };
    const first = Object.assign(new Error('ERR first'), { command });
    const second = Object.assign(new Error('ERR second', { cause: first }), { command });
    first.cause = second; // a loop: each the other's cause
    const mapped = replies.failure('k', 'release', undefined, second);
    assert.ok(mapped instanceof LockBackendError && mapped.cause === second, String(mapped));
    for (const error of [first, second]) {
      assert.equal(Object.keys(error).includes('command'), false);
    }
  });
});

describe('a reply cut off by shutdown', () => {
  const failure = (stopping: boolean, error: Error) => {
    const stop = new AbortController();
    if (stopping) stop.abort(new Error('shutting down'));
    const replies = new Replies({ replyTimeout: 100 } as LockBackend, 100, stop.signal, quoteKey);
    return replies.failure('k', 'release', undefined, error);
  };
  const closed = new Error('Connection is closed.');
  const quorum = (...failures: string[]) => new LockQuorumError(3, 2, 0, failures);

  it('is no reply in time (timedOut) once shutdown has begun: it closed the connection at its deadline', () => {
    for (const error of [
      closed,
      quorum('node 0: Connection is closed.', 'node 1: Connection is closed.'),
    ]) {
      const mapped = failure(true, error);
      assert.ok(mapped instanceof LockBackendError && mapped.timedOut, String(mapped));
    }
  });

  it('is not, before shutdown, nor when a node failed otherwise', () => {
    for (const [stopping, error] of [
      [false, closed],
      [true, new Error('ERR something else')],
      [true, quorum('node 0: Connection is closed.', 'node 1: NOPERM no rights')],
      // A round every node answered (none failed) was not cut off by anything.
      [true, quorum()],
    ] as const) {
      const mapped = failure(stopping, error);
      assert.ok(mapped instanceof LockBackendError && !mapped.timedOut, String(mapped));
    }
  });
});

describe('a reply that never came', () => {
  const replies = (backend: Partial<LockBackend>) =>
    new Replies(backend as LockBackend, 100, new AbortController().signal, quoteKey);

  it('names commandTimeout and, on one server, why Redis is unreachable', () => {
    const mapped = replies({
      replyTimeout: 100,
      unreachable: () => 'Redis at 127.0.0.1:1 is unreachable (connect ECONNREFUSED)',
    }).failure('k', 'extend', undefined, DEADLINE);
    assert.ok(mapped instanceof LockBackendError && mapped.timedOut, String(mapped));
    assert.match(
      mapped.message,
      /no reply within commandTimeout \(100 ms\): Redis at 127\.0\.0\.1:1 is unreachable/,
    );
  });

  it("in Redlock mode (a backend that knows no one server's reachability): its two rounds' bound (found by mutation testing)", () => {
    const mapped = replies({ replyTimeout: 300 }).failure('k', 'acquire', undefined, DEADLINE);
    assert.ok(mapped instanceof LockBackendError && mapped.timedOut, String(mapped));
    assert.match(
      mapped.message,
      /no answer within 300 ms \(Redlock: two rounds of commandTimeout\)/,
    );
  });
});
