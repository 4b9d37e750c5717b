import type { ModulesContainer } from '@nestjs/core';

/** One of Nest's modules, as the app's `ModulesContainer` holds it. */
export type NestModule = ModulesContainer extends Map<string, infer M> ? M : never;
/** Nest's record of one provider, controller, guard or middleware of a module. */
export type InstanceWrapper = NonNullable<ReturnType<NestModule['providers']['get']>>;

/**
 * Every wrapper of `modules` whose instances Nest calls lifecycle hooks on: providers (the
 * module's own class among them), controllers, injectables (guards, pipes, interceptors) and
 * middlewares.
 */
export function wrappersOf(modules: Iterable<NestModule>): InstanceWrapper[] {
  return [...modules].flatMap((module) => [
    ...module.providers.values(),
    ...module.controllers.values(),
    ...module.injectables.values(),
    ...module.middlewares.values(),
  ]);
}

/**
 * The instances of `wrapper` that live as long as the app (those Nest calls hooks on): a
 * singleton's, or each of a transient provider's made for a singleton. None for a request-scoped
 * provider, or a transient one made per request.
 */
export function lastingInstances(wrapper: InstanceWrapper): object[] {
  if (!wrapper.isDependencyTreeStatic()) return [];
  const instances: unknown[] = wrapper.isTransient
    ? wrapper.getStaticTransientInstances().map((host) => host?.instance)
    : [wrapper.instance];
  return instances.filter(
    (instance): instance is object => typeof instance === 'object' && instance !== null,
  );
}

/**
 * Whether Nest makes `wrapper`'s instances from a class (and so injects our properties into them),
 * rather than by a factory or as a given value. An alias (`useExisting`) is its target's instance.
 */
export function madeByNest(wrapper: InstanceWrapper): boolean {
  return wrapper.isAlias || !wrapper.isNotMetatype;
}

/**
 * Has `wrapper`'s factory pass each instance it makes through `made` first: for a request-scoped
 * or transient `useFactory` provider, whose instances are made after the app's startup.
 */
export function followFactory(wrapper: InstanceWrapper, made: (instance: unknown) => void): void {
  const factory = wrapper.metatype as ((...deps: unknown[]) => unknown) | null;
  if (typeof factory !== 'function') return;
  wrapper.metatype = function (this: unknown, ...deps: unknown[]): unknown {
    const instance = factory.apply(this, deps);
    if (!isPromiseLike(instance)) {
      made(instance);
      return instance;
    }
    return Promise.resolve(instance).then((resolved) => {
      made(resolved);
      return resolved;
    });
  };
}

/**
 * Puts `before` ahead of `instance`'s own `hook` (or its class's), as a property of the instance:
 * Nest finds it there when it calls the hook. Skips an instance that cannot take a property (a
 * frozen `useValue` object).
 */
export function runBefore(
  instance: object,
  hook: 'onModuleDestroy',
  before: () => Promise<unknown>,
): void {
  const own = (instance as Record<string, unknown>)[hook];
  if (typeof own !== 'function') return;
  defineHook(instance, hook, async function (this: unknown, ...args: unknown[]) {
    await before();
    return (own as (...a: unknown[]) => unknown).apply(this, args);
  });
}

/** Puts `after` behind `instance`'s own `hook`, whether it has one or not (see `runBefore`). */
export function runAfter(
  instance: object,
  hook: 'onApplicationBootstrap',
  after: () => void,
): boolean {
  const own = (instance as Record<string, unknown>)[hook];
  return defineHook(instance, hook, async function (this: unknown, ...args: unknown[]) {
    if (typeof own === 'function') await (own as (...a: unknown[]) => unknown).apply(this, args);
    after();
  });
}

function defineHook(instance: object, hook: string, value: unknown): boolean {
  try {
    Object.defineProperty(instance, hook, { value, configurable: true, writable: true });
    return true;
  } catch {
    return false;
  }
}

function isPromiseLike(value: unknown): value is PromiseLike<unknown> {
  return typeof (value as PromiseLike<unknown> | undefined)?.then === 'function';
}
