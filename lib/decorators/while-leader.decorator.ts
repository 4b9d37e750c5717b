import { RedisLockConfigurationError } from '../errors/redis-lock.errors.js';
import type { LeadOptions } from '../lock.leadership.js';
import { LockService } from '../lock.service.js';
import { assertKey } from '../options/checks.js';
import { leadOptionsProblem } from '../options/acquire-options.js';
import { injectLockService, lockServiceIn, refuseStatic } from './lock-service.injection.js';

/** On a class: its `@WhileLeader` methods. */
const LEADER_METHODS = Symbol('nestjs-redis-lock:leader-methods');
/** The instances whose `@WhileLeader` methods campaign, and for which LockService (once each). */
const leading = new WeakMap<object, LockService>();

/** `@nestjs/schedule`'s mark of a `@Cron`, `@Interval` or `@Timeout` method (its `SCHEDULER_TYPE`). */
const SCHEDULER_TYPE = 'SCHEDULER_TYPE';

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
    refuseStatic(target, option(''));
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
    return descriptor;
  };
}

/**
 * @internal Throws `RedisLockConfigurationError` if a `@WhileLeader` method of `instance` is also
 * a `@nestjs/schedule` job (`@Cron`, `@Interval`, `@Timeout`, in either order).
 */
export function checkLeaderMethods(instance: unknown): void {
  for (const { name, method } of leaderMethodsOf(instance)) {
    if (Reflect.getMetadata(SCHEDULER_TYPE, method) === undefined) continue;
    throw new RedisLockConfigurationError(
      `@WhileLeader(${(instance as object).constructor.name}.${String(name)})`,
      'with @Cron, @Interval or @Timeout',
      "the scheduler would call it on every instance, without a term: for a job that runs on one instance per fire, use @Cron with @WithLock({ key, onBusy: 'skip' }); for work that runs for as long as this instance leads, use @WhileLeader alone",
    );
  }
}

/**
 * @internal Starts a leadership for every `@WhileLeader` method of `instance` whose LockService
 * is `locks` (an instance made in another app's or module's scope is that LockService's), once per
 * instance and LockService. Returns how many were started.
 */
export function startLeaderMethods(instance: unknown, locks: LockService): number {
  if (typeof instance !== 'object' || instance === null || leading.get(instance) === locks) {
    return 0;
  }
  if (lockServiceIn(instance) !== locks) return 0;
  const methods = leaderMethodsOf(instance);
  if (methods.length === 0) return 0;
  leading.set(instance, locks);
  for (const { key, options, method } of methods) {
    locks.lead(key, (term) => method.call(instance, term), options);
  }
  return methods.length;
}

/** The `@WhileLeader` methods of `instance`, with the functions they name on it. */
function leaderMethodsOf(
  instance: unknown,
): (LeaderMethod & { method: (term: unknown) => unknown })[] {
  if (typeof instance !== 'object' || instance === null) return [];
  const methods = (Reflect.getMetadata(LEADER_METHODS, instance.constructor) ??
    []) as LeaderMethod[];
  return methods.map((leader) => ({
    ...leader,
    method: (instance as Record<string | symbol, (term: unknown) => unknown>)[leader.name],
  }));
}

/** @internal Whether `metatype` (a provider's class) has `@WhileLeader` methods. */
export function hasLeaderMethods(metatype: unknown): metatype is { name: string } {
  return (
    typeof metatype === 'function' && Reflect.getMetadata(LEADER_METHODS, metatype) !== undefined
  );
}
