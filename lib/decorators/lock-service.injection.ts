import { Inject } from '@nestjs/common';
import { RedisLockConfigurationError } from '../errors/redis-lock.errors.js';
import { LockService } from '../lock.service.js';

/**
 * Where Nest injects the app's own LockService into every instance of a class using `@WithLock`
 * or `@WhileLeader`: the one of the module the instance is made in.
 */
const LOCK_SERVICE = Symbol('nestjs-redis-lock:LockService');
/** On a class with `@WithLock` or `@WhileLeader` methods (see `lacksLockService`). */
const LOCKED_CLASS = Symbol('nestjs-redis-lock:locked-class');

/** Has Nest inject the module's LockService into every instance of `prototype`'s class. */
export function injectLockService(prototype: object): void {
  Reflect.defineMetadata(LOCKED_CLASS, true, prototype.constructor);
  Inject(LockService)(prototype, LOCK_SERVICE);
}

/**
 * @internal Whether `instance` has `@WithLock` or `@WhileLeader` methods but no LockService: Nest
 * injects properties only into the instances it creates from a class, not into a `useFactory` or
 * `useValue` one.
 */
export function lacksLockService(instance: unknown): instance is object {
  if (typeof instance !== 'object' || instance === null) return false;
  const locked = Reflect.getMetadata(LOCKED_CLASS, instance.constructor) === true;
  return (
    locked && !((instance as { [LOCK_SERVICE]?: unknown })[LOCK_SERVICE] instanceof LockService)
  );
}

/** @internal Gives such an instance the app's LockService, as Nest gives a class's instances. */
export function provideLockService(instance: object, locks: LockService): void {
  Object.defineProperty(instance, LOCK_SERVICE, { value: locks, configurable: true });
}

/** @internal The LockService of `instance`, or `undefined` (see `lockServiceOf`). */
export function lockServiceIn(instance: object): LockService | undefined {
  const locks = (instance as { [LOCK_SERVICE]?: unknown } | undefined)?.[LOCK_SERVICE];
  return locks instanceof LockService ? locks : undefined;
}

/** The LockService of `instance`, which `decorator` on `method` needs. */
export function lockServiceOf(
  instance: object,
  decorator: '@WithLock' | '@WhileLeader',
  method: string,
): LockService {
  const locks = lockServiceIn(instance);
  if (locks === undefined) {
    throw new RedisLockConfigurationError(
      `${decorator}(${method})`,
      instance,
      'the instance has no LockService: it must be created by Nest (not with `new`) in a module where RedisLockModule is imported or registered with isGlobal',
    );
  }
  return locks;
}
