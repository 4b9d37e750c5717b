import { Inject } from '@nestjs/common';
import { RedisLockConfigurationError } from '../errors/redis-lock.errors.js';
import { LockService } from '../lock.service.js';

/**
 * Where Nest injects the app's own LockService into every instance of a class using `@WithLock`
 * or `@WhileLeader`: the one of the module the instance is made in. Its description is what Nest's
 * error names when that module cannot see a LockService, so it says what to do.
 */
const LOCK_SERVICE = Symbol(
  'the LockService that @WithLock and @WhileLeader need: import RedisLockModule into this module, or register it with isGlobal: true',
);
/** On a class with `@WithLock` or `@WhileLeader` methods (see `lockedInstance`). */
const LOCKED_CLASS = Symbol('nestjs-redis-lock:locked-class');

/** Has Nest inject the module's LockService into every instance of `prototype`'s class. */
export function injectLockService(prototype: object): void {
  Reflect.defineMetadata(LOCKED_CLASS, true, prototype.constructor);
  Inject(LockService)(prototype, LOCK_SERVICE);
}

/**
 * @internal Refuses a decorator on a static method (`target` is then the class): Nest injects
 * nothing into a class, only into its instances.
 */
export function refuseStatic(target: object, what: string): void {
  if (typeof target !== 'function') return;
  throw new RedisLockConfigurationError(
    what,
    'a static method',
    'decorate an instance method of a provider (Nest injects the LockService into instances, not into the class), or call LockService.using() / lead() in the static one',
  );
}

/** @internal Whether `instance`'s class has `@WithLock` or `@WhileLeader` methods. */
export function lockedInstance(instance: unknown): instance is object {
  return (
    typeof instance === 'object' &&
    instance !== null &&
    Reflect.getMetadata(LOCKED_CLASS, instance.constructor) === true
  );
}

/**
 * @internal Gives `instance` the app's LockService, as Nest gives a class's instances: to one
 * Nest injects nothing into (made by `useFactory`, given as `useValue`). Throws
 * `RedisLockConfigurationError` if it has the LockService of another app that still runs (a
 * `useValue` object shared by two apps): it cannot lock for both. One whose app has closed (a
 * test suite's or a hot reload's next app) is given this one.
 */
export function provideLockService(instance: object, locks: LockService, name: string): void {
  const had = lockServiceIn(instance);
  if (had === locks) return;
  if (had && !(had instanceof LockService && !had.running)) {
    throw new RedisLockConfigurationError(
      `@WithLock/@WhileLeader(${instance.constructor.name})`,
      name,
      'this instance (given as useValue, or made by useFactory) is already used by another Nest app that is still running, and one instance can lock for one app only: give each app its own instance (`useClass`, or a `useFactory` that makes a new one)',
    );
  }
  if (
    !Object.isExtensible(instance) &&
    !Object.prototype.hasOwnProperty.call(instance, LOCK_SERVICE)
  ) {
    throw new RedisLockConfigurationError(
      `@WithLock/@WhileLeader(${instance.constructor.name})`,
      name,
      'this instance is frozen, sealed or not extensible, so it cannot be given its LockService: provide the class itself (`providers: [MyService]`), or freeze it after Nest made it',
    );
  }
  Object.defineProperty(instance, LOCK_SERVICE, { value: locks, configurable: true });
}

/**
 * @internal The LockService of `instance`, or `undefined` (see `lockServiceOf`). Anything with
 * LockService's methods counts: a test double given with `overrideProvider(LockService)`.
 */
export function lockServiceIn(instance: object): LockService | undefined {
  const locks = (instance as { [LOCK_SERVICE]?: Partial<LockService> } | undefined)?.[LOCK_SERVICE];
  return typeof locks?.using === 'function' ? (locks as LockService) : undefined;
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
      'the instance has no LockService: it must be a provider of a Nest app (not made with `new`) in a module where RedisLockModule is imported or registered with isGlobal',
    );
  }
  return locks;
}
