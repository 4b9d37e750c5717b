import { RedisLockConfigurationError } from '../errors/redis-lock.errors.js';
import type { Leadership, LeadOptions } from '../lock.leadership.js';
import { LockService } from '../lock.service.js';
import { assertKey } from '../options/checks.js';
import { leadOptionsProblem } from '../options/acquire-options.js';
import { injectLockService, lockServiceIn } from './lock-service.injection.js';

/** On a class: its `@WhileLeader` methods. */
const LEADER_METHODS = Symbol('nestjs-redis-lock:leader-methods');
/** On a class's prototype once its `onModuleDestroy` stops its leaderships first. */
const STOPS_LEADERS = Symbol('nestjs-redis-lock:stops-leaders');

/** The leaderships of each instance's `@WhileLeader` methods. */
const leading = new WeakMap<object, readonly Leadership[]>();

interface LeaderMethod {
  readonly name: string | symbol;
  readonly key: string;
  readonly options: LeadOptions | undefined;
}

/**
 * Runs a provider method for as long as this instance leads `key`: from the app's bootstrap to
 * its shutdown, the module campaigns for `key` with `LockService.lead()` and calls the method with
 * each term (`(term: LeaderTerm) => Promise<void>`), as `@nestjs/schedule` calls its `@Cron`
 * methods. The method should run until `term.signal` aborts and pass `term.fence` with its
 * writes; when it returns or throws (logged), the campaign goes on.
 *
 * The class must be a singleton provider Nest instantiates in a module where `LockService` is
 * available. Options are checked when the class is defined: a bad key or TTL throws
 * `RedisLockConfigurationError` at once.
 * @example
 * \@WhileLeader('leader:ingest', { ttl: 10_000 })
 * async ingest({ fence, signal }: LeaderTerm): Promise<void> {
 *   while (!signal.aborted) await this.ingestBatch(fence, signal);
 * }
 */
export function WhileLeader(key: string, options?: LeadOptions): MethodDecorator {
  return (target, propertyKey, descriptor) => {
    const method = `${target.constructor.name}.${String(propertyKey)}`;
    const option = (name: string): string => `@WhileLeader(${method})${name}`;
    if (typeof descriptor.value !== 'function') {
      throw new RedisLockConfigurationError(
        option(''),
        descriptor.value,
        'can only decorate a method',
      );
    }
    try {
      assertKey(key);
    } catch (error) {
      throw new RedisLockConfigurationError(
        option('.key'),
        key,
        (error as { problem: string }).problem,
      );
    }
    const problem = leadOptionsProblem(options);
    if (problem) {
      const [name, value, what] = problem;
      throw new RedisLockConfigurationError(
        option(name === 'options' ? '' : `.${name}`),
        value,
        what,
      );
    }
    const methods = (Reflect.getMetadata(LEADER_METHODS, target.constructor) ??
      []) as LeaderMethod[];
    Reflect.defineMetadata(
      LEADER_METHODS,
      [...methods, { name: propertyKey, key, options }],
      target.constructor,
    );
    injectLockService(target);
    stopLeadersFirst(target);
    return descriptor;
  };
}

/**
 * Makes the class's `onModuleDestroy` stop its instance's leaderships first (their work waited
 * for, up to the longest leader TTL), then do what it did (its own, or its parent class's): Nest
 * destroys what an instance depends on after the instance itself (NestJS 12 orders a module's
 * providers by their dependencies, and modules from the root outward), so nothing the leader's work
 * uses is torn down while it still runs, whichever module the lock module is in or whether it is
 * global. (`LockService.onModuleDestroy` runs after every module nearer the root than its own.)
 */
function stopLeadersFirst(prototype: object): void {
  if (Object.prototype.hasOwnProperty.call(prototype, STOPS_LEADERS)) return;
  Object.defineProperty(prototype, STOPS_LEADERS, { value: true });
  const own = Object.getOwnPropertyDescriptor(prototype, 'onModuleDestroy')?.value as
    ((...args: unknown[]) => unknown) | undefined;
  const parent = Object.getPrototypeOf(prototype) as { onModuleDestroy?: unknown } | null;
  Object.defineProperty(prototype, 'onModuleDestroy', {
    configurable: true,
    writable: true,
    value: async function onModuleDestroy(this: object, ...args: unknown[]): Promise<void> {
      const leaderships = leading.get(this);
      if (leaderships) await lockServiceIn(this)?.stopLeaderships(leaderships);
      const then = own ?? parent?.onModuleDestroy;
      if (typeof then === 'function')
        await (then as (...a: unknown[]) => unknown).apply(this, args);
    },
  });
}

/**
 * @internal Starts a leadership for every `@WhileLeader` method of `instance` whose LockService
 * is `locks` (an instance made in another app's or module's scope is that LockService's). Returns
 * how many were started.
 */
export function startLeaderMethods(instance: unknown, locks: LockService): number {
  if (typeof instance !== 'object' || instance === null) return 0;
  const methods = Reflect.getMetadata(LEADER_METHODS, instance.constructor) as
    LeaderMethod[] | undefined;
  if (methods === undefined || lockServiceIn(instance) !== locks) return 0;
  const leaderships = methods.map(({ name, key, options }) => {
    const method = (instance as Record<string | symbol, (term: unknown) => unknown>)[name];
    return locks.lead(key, (term) => method.call(instance, term), options);
  });
  leading.set(instance, leaderships);
  return methods.length;
}

/** @internal Whether `metatype` (a provider's class) has `@WhileLeader` methods. */
export function hasLeaderMethods(metatype: unknown): metatype is { name: string } {
  return (
    typeof metatype === 'function' && Reflect.getMetadata(LEADER_METHODS, metatype) !== undefined
  );
}
