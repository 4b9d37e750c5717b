import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { LockKeyResolutionError, RedisLockConfigurationError, WithLock } from '../../lib/index.js';
import { compileLockKey } from '../../lib/decorators/lock-key.resolver.js';

const resolve = (template: string, ...args: unknown[]): string | string[] =>
  compileLockKey(template, 'Test.method')(args);

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
