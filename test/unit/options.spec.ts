import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { LockArgumentError } from '../../lib/index.js';
import { quoteKey } from '../../lib/errors/redis-lock.errors.js';
import {
  DEFAULT_LOCK_DEFAULTS,
  MAX_DURATION,
  type ResolvedDefaults,
} from '../../lib/options/defaults.js';
import { resolveAcquireOptions } from '../../lib/options/acquire-options.js';
import { resolveModuleOptions } from '../../lib/options/module-options.js';
import { validateWithLockOptions } from '../../lib/options/decorator-options.js';
import { RedisLockConfigurationError } from '../../lib/index.js';

describe('per-call options (pure validation)', () => {
  const defaults: ResolvedDefaults = {
    ...DEFAULT_LOCK_DEFAULTS,
    maxKeyLength: 512,
    keyView: quoteKey,
  };

  function argumentError(fn: () => unknown): LockArgumentError {
    try {
      fn();
    } catch (error) {
      assert.ok(error instanceof LockArgumentError, String(error));
      return error;
    }
    assert.fail('expected a LockArgumentError');
  }

  it('applies the defaults, with autoExtend depending on the method', () => {
    assert.deepEqual(resolveAcquireOptions('k', undefined, defaults, 'acquire'), {
      ttl: 10_000,
      acquireTimeout: 5_000,
      autoExtend: false,
      signal: undefined,
      token: undefined,
      shape: { limit: 1, mode: 'write', fair: false },
      holdAtLeast: 0,
      skipWhenBusy: false,
      counted: true,
    });
    assert.equal(resolveAcquireOptions('k', {}, defaults, 'using').autoExtend, true);
    assert.equal(resolveAcquireOptions('k', {}, defaults, 'tryAcquire').acquireTimeout, 0);
    assert.equal(
      resolveAcquireOptions('k', {}, { ...defaults, autoExtend: false }, 'using').autoExtend,
      false,
    );
    assert.equal(
      resolveAcquireOptions('k', {}, { ...defaults, autoExtend: true }, 'acquire').autoExtend,
      true,
    );
    assert.equal(
      resolveAcquireOptions('k', { autoExtend: false }, defaults, 'using').autoExtend,
      false,
    );
  });

  for (const key of ['', undefined, null, 42, {}]) {
    it(`rejects the key ${JSON.stringify(key)}`, () => {
      const error = argumentError(() => resolveAcquireOptions(key, {}, defaults, 'acquire'));
      assert.equal(error.argument, 'key');
      assert.equal(error.value, key);
    });
  }

  const badDurations: unknown[] = [
    Number.NaN,
    Infinity,
    -Infinity,
    -1,
    1.5,
    '100',
    null,
    MAX_DURATION + 1,
  ];
  for (const value of badDurations) {
    it(`rejects ttl ${String(value)} and acquireTimeout ${String(value)}, naming the option`, () => {
      assert.equal(
        argumentError(() =>
          resolveAcquireOptions('k', { ttl: value as number }, defaults, 'acquire'),
        ).argument,
        'ttl',
      );
      assert.equal(
        argumentError(() =>
          resolveAcquireOptions('k', { acquireTimeout: value as number }, defaults, 'acquire'),
        ).argument,
        'acquireTimeout',
      );
    });
  }

  it('rejects a zero ttl but accepts a zero acquireTimeout', () => {
    assert.equal(
      argumentError(() => resolveAcquireOptions('k', { ttl: 0 }, defaults, 'acquire')).argument,
      'ttl',
    );
    assert.equal(
      resolveAcquireOptions('k', { acquireTimeout: 0 }, defaults, 'acquire').acquireTimeout,
      0,
    );
  });

  it('rejects a bad token, signal, autoExtend or an unknown option', () => {
    assert.equal(
      argumentError(() => resolveAcquireOptions('k', { token: '' }, defaults, 'acquire')).argument,
      'token',
    );
    assert.equal(
      argumentError(() =>
        resolveAcquireOptions('k', { signal: {} as AbortSignal }, defaults, 'acquire'),
      ).argument,
      'signal',
    );
    assert.equal(
      argumentError(() =>
        resolveAcquireOptions('k', { autoExtend: 1 as never }, defaults, 'acquire'),
      ).argument,
      'autoExtend',
    );
    assert.equal(
      argumentError(() => resolveAcquireOptions('k', { timeout: 5 } as never, defaults, 'acquire'))
        .argument,
      'timeout',
    );
  });

  it('the error message names the option and the value', () => {
    const error = argumentError(() => resolveAcquireOptions('k', { ttl: -5 }, defaults, 'acquire'));
    assert.match(error.message, /ttl/);
    assert.match(error.message, /-5/);
  });

  it('a mistyped option gets "did you mean", at every level; a name near none gets no guess', () => {
    const message = (fn: () => unknown): string => {
      try {
        fn();
      } catch (error) {
        assert.ok(
          error instanceof LockArgumentError || error instanceof RedisLockConfigurationError,
          String(error),
        );
        return error.message;
      }
      assert.fail('expected an error');
    };
    const connection = 'redis://127.0.0.1:1';
    assert.match(
      message(() => resolveModuleOptions({ connection, defaults: { acquireTimout: 5 } } as never)),
      /"defaults\.acquireTimout".*did you mean defaults\.acquireTimeout\?/,
    );
    assert.match(
      message(() => resolveModuleOptions({ connection, keyprefix: 'x:' } as never)),
      /did you mean keyPrefix\?/,
    );
    assert.match(
      message(() =>
        resolveModuleOptions({ connection, replicaAck: { replica: 1, timeout: 5 } } as never),
      ),
      /did you mean replicaAck\.replicas\?/,
    );
    assert.match(
      message(() => resolveAcquireOptions('k', { acquireTimout: 5 } as never, defaults, 'acquire')),
      /did you mean acquireTimeout\?/,
    );
    assert.match(
      message(() => validateWithLockOptions({ key: 'k', onbusy: 'skip' } as never, 'C.m')),
      /did you mean .*onBusy\?/,
    );
    assert.doesNotMatch(
      message(() => resolveAcquireOptions('k', { zzzzzzzz: 5 } as never, defaults, 'acquire')),
      /did you mean/,
    );
  });

  it('messages show what was given in words, nothing for what was not, and why a string is no duration', () => {
    const message = (options: object): string => {
      try {
        resolveModuleOptions(options);
      } catch (error) {
        assert.ok(error instanceof RedisLockConfigurationError, String(error));
        return error.message;
      }
      assert.fail('expected a RedisLockConfigurationError');
    };
    class Svc {}
    const connection = 'redis://127.0.0.1:1';
    assert.match(message({ client: new Svc() }), /"client" \(an instance of Svc\): /);
    assert.match(message({ connection: Svc }), /"connection" \(the class Svc\): /);
    assert.match(message({ connection, defaults: [] }), /"defaults" \(an array of 0\)/);
    assert.match(message({ connection, replicaAck: { x: 1 } }), /replicaAck\.x/);
    assert.match(
      message({ client: {}, connection }),
      /^Invalid option "client \+ connection": give/,
    );
    assert.doesNotMatch(message({}), /undefined/);
    assert.match(
      message({ connection, defaults: { ttl: '5000' } }),
      /"defaults\.ttl" \("5000"\): .*values read from the environment .* are strings; convert them with Number/,
    );
    assert.doesNotMatch(message({ connection, defaults: { ttl: 'soon' } }), /environment/);
  });

  it("a caller's token is checked as a key is: well-formed, and bounded (two lone surrogates would be one token in Redis)", () => {
    for (const token of ['tok\uD800', 'tok\uDBFF', '\uDC00']) {
      const error = argumentError(() => resolveAcquireOptions('k', { token }, defaults, 'acquire'));
      assert.equal(error.argument, 'token');
      assert.match(error.message, /well-formed Unicode/);
    }
    const long = argumentError(() =>
      resolveAcquireOptions('k', { token: 'x'.repeat(257) }, defaults, 'acquire'),
    );
    assert.match(long.message, /at most 256 characters/);
    assert.doesNotMatch(long.message, /x{20}/, 'the token is never echoed');
    for (const token of ['x'.repeat(256), 'tok-é-🔒', 'a']) {
      assert.equal(resolveAcquireOptions('k', { token }, defaults, 'acquire').token, token);
    }
  });
});
