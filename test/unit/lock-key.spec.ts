import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { LockKeyResolutionError } from '../../lib/index.js';
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
