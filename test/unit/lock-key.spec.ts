import assert from 'node:assert/strict';
import { inspect } from 'node:util';
import fc from 'fast-check';
import { describe, it } from 'node:test';
import { LockKeyResolutionError, RedisLockConfigurationError, WithLock } from '../../lib/index.js';
import { compileLockKey } from '../../lib/decorators/lock-key.resolver.js';

const resolve = (template: string, ...args: unknown[]): string | string[] =>
  compileLockKey(template, 'Test.method')(args, Infinity);

const unresolved = (placeholder: string) => (error: unknown) =>
  error instanceof LockKeyResolutionError && error.message.includes(placeholder);

describe('key templates read own properties only', () => {
  it('an own property, at any depth, and a string own property such as length', () => {
    assert.equal(resolve('acct:{0.id}', { id: 7 }), 'acct:7');
    assert.equal(resolve('{0.a.b}:{1}', { a: { b: 'x' } }, 'y'), 'x:y');
    assert.equal(resolve('len:{0.length}', 'abc'), 'len:3');
    class Dto {
      constructor(readonly id: string) {}
    }
    assert.equal(resolve('dto:{0.id}', new Dto('d1')), 'dto:d1');
  });

  it('a property found on the prototype is missing: LockKeyResolutionError, never a shared key', () => {
    const inherited = Object.create({ id: 'shared' }) as object;
    assert.throws(() => resolve('acct:{0.id}', inherited), unresolved('{0.id}'));
    assert.throws(() => resolve('{0.constructor.name}', {}), unresolved('{0.constructor.name}'));
    assert.throws(() => resolve('{0.toString}', {}), unresolved('{0.toString}'));
  });

  it('a polluted Object.prototype does not fill in a missing id', () => {
    const proto = Object.prototype as Record<string, unknown>;
    proto.id = 'polluted';
    try {
      assert.throws(() => resolve('acct:{0.id}', { name: 'no id' }), unresolved('{0.id}'));
    } finally {
      delete proto.id;
    }
  });
});

describe('@WithLock templates checked against the declared parameters, when the class is defined', () => {
  class PayDto {
    orderId = '';
  }
  const refused = (pattern: RegExp) => (error: unknown) =>
    error instanceof RedisLockConfigurationError && pattern.test(error.message);

  it('refuses a placeholder past the last parameter', () => {
    assert.throws(
      () => {
        class Orders {
          @WithLock('order:{1}')
          async pay(id: string): Promise<string> {
            return id;
          }
        }
        return Orders;
      },
      refused(/\{1\} reads argument 1, but Orders\.pay declares 1 parameter/),
    );
  });

  it('refuses a property of a string or number parameter', () => {
    assert.throws(
      () => {
        class Orders {
          @WithLock({ key: ['order:{0}', 'acct:{0.id}'] })
          async pay(id: string): Promise<string> {
            return id;
          }
        }
        return Orders;
      },
      refused(/\{0\.id\} reads property "id" of parameter 0, which is a string: write \{0\}/),
    );
    assert.throws(
      () => {
        class Orders {
          @WithLock('order:{1.id}')
          async pay(tenant: string, id: number): Promise<string> {
            return `${tenant}${id}`;
          }
        }
        return Orders;
      },
      refused(/which is a number/),
    );
  });

  it('accepts what may resolve: a DTO property, a string whole or its length, untyped, union, default and rest parameters (comments, regexes and strings in the list), a class-typed parameter whole', () => {
    class Orders {
      @WithLock('order:{0.orderId}')
      async a(dto: PayDto): Promise<string> {
        return dto.orderId;
      }
      @WithLock('order:{0}:{0.length}')
      async b(id: string): Promise<string> {
        return id;
      }
      @WithLock('order:{0.id}:{1}')
      async c(query: { id?: string }, n: string | number): Promise<string> {
        return `${query.id}${n}`;
      }
      @WithLock('order:{2}')
      async d(...ids: string[]): Promise<string> {
        return ids.join();
      }
      @WithLock('job:{0}:{2}')
      async f(
        tenant: string, // a comment with a ) in it
        ...ids: string[]
      ): Promise<string> {
        return tenant + ids.join(')');
      }
      @WithLock('k:{2}')
      async g(sep = /[\]]/, ...ids: string[]): Promise<string> {
        return ids.join(String(sep));
      }
      @WithLock('k:{1}')
      async h(a: string, b = 'x'): Promise<string> {
        return a + b;
      }
      @WithLock('report:{0}') // a route may pass a string where Date is declared
      async i(day: Date): Promise<string> {
        return String(day);
      }
      @WithLock('order:{0}')
      async j(dto: PayDto): Promise<string> {
        return dto.orderId;
      }
      @WithLock((id: string) => `order:${id}`)
      async e(id: string): Promise<string> {
        return id;
      }
    }
    assert.equal(typeof Orders.prototype.a, 'function');
  });
});

describe('a key that cannot be built says so without letting request data forge log lines', () => {
  it('names from a JSON body are quoted, a constructor.name the data carries is never used', () => {
    const body = JSON.parse(
      '{"id": {"constructor": {"name": "x\\n[Nest] 1 LOG [AuthService] admin logged in"}, "a\\nb": 1}}',
    ) as unknown;
    let message = '';
    try {
      resolve('order:{0.id}', body);
    } catch (error) {
      assert.ok(error instanceof LockKeyResolutionError);
      message = error.message;
    }
    assert.match(message, /resolved to an object with "constructor", "a\\nb"/);
    assert.doesNotMatch(message, /\n/);
    assert.doesNotMatch(message, /AuthService/);
  });
});

describe('one key per (template, arguments): a value never writes the template separators', () => {
  it("percent-encodes %, braces, ':', control characters and the template's own separators", () => {
    assert.equal(resolve('order:{0}', '42:refund'), 'order:42%3Arefund');
    assert.equal(resolve('order:{0}', '42%3Arefund'), 'order:42%253Arefund');
    assert.equal(resolve('order:{0}', '}{x'), 'order:%7D%7Bx');
    assert.equal(resolve('order:{0}', 'a\r\nb'), 'order:a%0D%0Ab');
    assert.equal(resolve('order/{0}-{1}', 'a-b/c', 'd.e'), 'order/a%2Db%2Fc-d.e');
    assert.equal(resolve('t→{0}', 'x→y'), 't→x%E2%86%92y');
    // Letters, digits and separators the template does not use are left as they are.
    assert.equal(resolve('order:{0}', 'Ünïcode-1.5 x'), 'order:Ünïcode-1.5 x');
    assert.equal(resolve('order:{0}', 42), 'order:42');
  });

  it('another template (or a fixed key) cannot be reached through a value', () => {
    const refund = resolve('order:{0}:refund', '42');
    for (const value of ['42:refund', '42%3Arefund', '42\u003Arefund']) {
      assert.notEqual(resolve('order:{0}', value), refund);
    }
    assert.notEqual(resolve('{0}', 'order:42'), 'order:42');
    assert.notEqual(resolve('acct-{0}', 'a-b'), resolve('acct-{0}-b', 'a'));
  });

  it('different argument lists never build one key (property, 2,000 pairs)', () => {
    const separator = fc.constantFrom(':', '/', '-', '.', '|', ' ', ':x:');
    const value = fc
      .oneof(
        fc.string({
          unit: fc.constantFrom(
            'a',
            '1',
            ':',
            '%',
            '/',
            '-',
            '.',
            '{',
            '}',
            '|',
            ' ',
            'x',
            '\n',
            '3A',
          ),
        }),
        fc.integer().map(String),
      )
      .filter((text) => text.length > 0);
    fc.assert(
      fc.property(
        fc.tuple(fc.constantFrom('', 'k', 'k:'), separator, fc.constantFrom('', ':end', 'x')),
        fc.tuple(value, value),
        fc.tuple(value, value),
        ([head, middle, tail], a, b) => {
          const template = `${head}{0}${middle}{1}${tail}`;
          if (a[0] === b[0] && a[1] === b[1]) return;
          assert.notEqual(resolve(template, ...a), resolve(template, ...b), template);
        },
      ),
      { numRuns: 2_000 },
    );
  });

  it('refuses two placeholders without a separator between them, when the class is defined', () => {
    for (const template of ['{0}{1}', 'k:{0}x{1}', '{0}é{1}']) {
      assert.throws(
        () => resolve(template, 'a', 'b'),
        (error: unknown) =>
          error instanceof RedisLockConfigurationError &&
          /put a separator such as ":" between \{0\} and \{1\}/.test(error.message),
      );
    }
    assert.equal(resolve('{0}-{1}', 'a', 'b'), 'a-b');
  });
});

describe('maxKeyLength and validateKey', () => {
  const key = 'x'.repeat(20);
  it('a key longer than the limit (the decorator’s, else the module’s) is a LockKeyResolutionError', () => {
    const tooLong = (max: number) => (error: unknown) =>
      error instanceof LockKeyResolutionError &&
      error.reason === 'too-long' &&
      error.maxKeyLength === max &&
      error.message.includes(`the key is 22 characters long, more than maxKeyLength (${max})`) &&
      !error.message.includes(key);
    assert.throws(() => compileLockKey('k:{0}', 'T.m')([key], 21), tooLong(21));
    assert.equal(compileLockKey('k:{0}', 'T.m')([key], 22), `k:${key}`);
    assert.throws(
      () => compileLockKey('k:{0}', 'T.m', undefined, { maxKeyLength: 10 })([key], 512),
      tooLong(10),
    );
    // A key function's keys and each key of several are checked too.
    assert.throws(() => compileLockKey((id: string) => `k:${id}`, 'T.m')([key], 21), tooLong(21));
    assert.throws(() => compileLockKey(['a:{0}', 'k:{0}'], 'T.m')([key], 21), tooLong(21));
  });

  it('validateKey sees each key built (after encoding) and the arguments; anything but true refuses', () => {
    const seen: unknown[] = [];
    const resolver = compileLockKey(['a:{0}', 'b:{0}'], 'T.m', undefined, {
      validateKey: (built, args) => {
        seen.push([built, args[0]]);
        return built !== 'b:no';
      },
    });
    assert.deepEqual(resolver(['x:y'], 512), ['a:x%3Ay', 'b:x%3Ay']);
    assert.deepEqual(seen, [
      ['a:x%3Ay', 'x:y'],
      ['b:x%3Ay', 'x:y'],
    ]);
    assert.throws(
      () => resolver(['no'], 512),
      (error: unknown) =>
        error instanceof LockKeyResolutionError &&
        error.reason === 'refused' &&
        error.message.includes('validateKey refused the key "b:no"'),
    );
    const truthy = compileLockKey('a:{0}', 'T.m', undefined, {
      validateKey: () => 1 as unknown as boolean,
    });
    assert.throws(() => truthy(['x'], 512), LockKeyResolutionError);
  });

  it('a value with a lone surrogate resolves to nothing (Redis would get U+FFFD: two values, one key)', () => {
    assert.throws(() => resolve('k:{0}', 'a\uD800'), unresolved('{0}'));
    assert.throws(
      () => compileLockKey((id: string) => `k:${id}`, 'T.m')(['a\uDBFF'], 512),
      LockKeyResolutionError,
    );
  });
});

describe('what the review of the encoding found', () => {
  it("'%' is no separator between placeholders: the encoding writes it into values", () => {
    assert.throws(() => resolve('{0}%{1}', 'a', 'b'), RedisLockConfigurationError);
    assert.throws(() => resolve('id%{0}%{1}', 'a', 'b'), RedisLockConfigurationError);
    // With another separator beside it, every pair over a small alphabet gives its own key.
    for (const template of ['{0}:%{1}', '{0}%:{1}', '{0}%-{1}']) {
      const alphabet = ['a', '%', ':', '-', '3', 'A'];
      const values = [''].concat(alphabet);
      for (const x of alphabet) for (const y of alphabet) values.push(x + y);
      const seen = new Map<string, string>();
      for (const a of values.filter(Boolean)) {
        for (const b of values.filter(Boolean)) {
          const key = resolve(template, a, b) as string;
          const pair = JSON.stringify([a, b]);
          assert.equal(seen.get(key) ?? pair, pair, `${template}: ${seen.get(key)} and ${pair}`);
          seen.set(key, pair);
        }
      }
    }
  });

  it('a key named twice in a list (a transfer to the same account) is locked once', () => {
    assert.deepEqual(
      compileLockKey(['acct:{0.from}', 'acct:{0.to}'], 'T.m')([{ from: 1, to: '1' }], 512),
      ['acct:1'],
    );
  });

  it("a decorator's maxKeyLength above the module's never lets a key past the module's", () => {
    assert.throws(
      () =>
        compileLockKey('k:{0}', 'T.m', undefined, { maxKeyLength: 10_000 })(['x'.repeat(600)], 512),
      (error: unknown) => error instanceof LockKeyResolutionError && error.maxKeyLength === 512,
    );
  });

  it('the value (request data) stays out of inspect and JSON of the error; the message cuts it', () => {
    const long = 'x'.repeat(5_000);
    let thrown: unknown;
    try {
      compileLockKey('k:{0}', 'T.m')([long], 512);
    } catch (error) {
      thrown = error;
    }
    assert.ok(thrown instanceof LockKeyResolutionError);
    assert.equal(thrown.value, `k:${long}`);
    assert.ok(!inspect(thrown).includes(long.slice(0, 200)));
    assert.ok(!JSON.stringify(thrown).includes(long.slice(0, 200)));
  });
});
