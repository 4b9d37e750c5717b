import {
  Logger,
  Module,
  Optional,
  type OnApplicationBootstrap,
  type OnModuleInit,
} from '@nestjs/common';
import { LazyModuleLoader, ModulesContainer } from '@nestjs/core';
import {
  followFactory,
  lastingInstances,
  madeByNest,
  rootModule,
  runAfter,
  runBefore,
  wrappersOf,
  type InstanceWrapper,
  type NestModule,
} from './decorators/app-instances.js';
import { lockedInstance, provideLockService } from './decorators/lock-service.injection.js';
import { hasLeaderMethods, startLeaderMethods } from './decorators/while-leader.decorator.js';
import { RedisLockConfigurationError } from './errors/redis-lock.errors.js';
import { LockService } from './lock.service.js';
import { ConfigurableModuleClass } from './redis-lock.module-definition.js';

/**
 * Distributed locks on Redis. Register once, then inject `LockService`.
 *
 * `forRoot(options)` / `forRootAsync({ imports, inject, useFactory | useClass | useExisting })`,
 * both with `isGlobal` to make `LockService` injectable everywhere. Options are checked when the
 * app boots: invalid ones throw `RedisLockConfigurationError`.
 * @example
 * RedisLockModule.forRoot({ connection: 'redis://127.0.0.1:6379', isGlobal: true })
 * @example
 * RedisLockModule.forRootAsync({
 *   inject: [ConfigService],
 *   useFactory: (config: ConfigService) => ({ connection: config.getOrThrow('REDIS_URL') }),
 * })
 */
@Module({
  providers: [LockService],
  exports: [LockService],
})
export class RedisLockModule
  extends ConfigurableModuleClass
  implements OnModuleInit, OnApplicationBootstrap
{
  /** The app's modules this one has gone through (see `adopt`). */
  private readonly adopted = new WeakSet<NestModule>();

  constructor(
    private readonly modules: ModulesContainer,
    private readonly locks: LockService,
    @Optional() private readonly lazy?: LazyModuleLoader,
  ) {
    super();
  }

  /**
   * Providers with `@WithLock` or `@WhileLeader` methods that Nest injects nothing into (made by
   * `useFactory`, given as `useValue`; singletons, transient or request-scoped alike) are given
   * this app's LockService here, before any module's `onModuleInit` may call them; those made
   * later, as they are made. With several LockServices in the app, which one they should use is
   * unknown: the app fails to boot, naming the class (as it does for a `useValue` object another
   * running app uses).
   */
  async onModuleInit(): Promise<void> {
    try {
      this.equip(wrappersOf(this.modules.values()));
    } catch (error) {
      // A failed init is not followed by a shutdown in every Nest version: close what is open.
      await Promise.all([...this.services()].map((service) => service.onApplicationShutdown()));
      throw error;
    }
  }

  /**
   * Once the app has started: every `onModuleDestroy` of the app's providers (controllers,
   * guards and modules too) first stops this LockService's leaderships, so that nothing a leader's
   * work uses is torn down while it still runs, whatever the order Nest destroys modules in (the
   * lock module's own hook runs last when it is global). `@WhileLeader` methods campaign once every
   * `onApplicationBootstrap` of the app has returned (after the root module's, which Nest calls
   * last), as `@nestjs/schedule` starts its jobs: a leader's work never runs before the providers
   * it uses are ready, nor in an app whose startup failed. Modules loaded later with
   * `LazyModuleLoader` are gone through when they are loaded.
   */
  onApplicationBootstrap(): void {
    const modules = [...this.modules.values()];
    for (const module of modules) this.adopted.add(module);
    const wrappers = wrappersOf(modules);
    this.stopLeadersFirst(wrappers);
    this.followLazyModules();
    const root = rootModule(modules)?.instance;
    if (!root || !runAfter(root, 'onApplicationBootstrap', () => this.campaign(wrappers))) {
      this.campaign(wrappers);
    }
  }

  /** See `onModuleInit`. */
  private equip(wrappers: readonly InstanceWrapper[]): void {
    const give = (instance: unknown, name: string): void => {
      if (!lockedInstance(instance)) return;
      if (this.services().size > 1) {
        throw new RedisLockConfigurationError(
          `@WithLock/@WhileLeader(${instance.constructor.name})`,
          name,
          'this provider is made by useFactory or given as useValue, so Nest injects nothing into it, and the app has several LockServices to choose from: provide the class itself (`providers: [MyService]` or `useClass`)',
        );
      }
      provideLockService(instance, this.locks, name);
    };
    for (const wrapper of wrappers) {
      if (madeByNest(wrapper)) continue;
      const name = String(wrapper.name);
      for (const instance of lastingInstances(wrapper)) give(instance, name);
      if (wrapper.isFactory && (wrapper.isTransient || !wrapper.isDependencyTreeStatic())) {
        followFactory(wrapper, (instance) => give(instance, name));
      }
    }
  }

  /** See `onApplicationBootstrap`. */
  private stopLeadersFirst(wrappers: readonly InstanceWrapper[]): void {
    const instances = new Set(wrappers.flatMap(lastingInstances));
    for (const instance of instances) {
      if (instance instanceof LockService) continue;
      runBefore(instance, 'onModuleDestroy', () => this.locks.onModuleDestroy());
    }
  }

  /**
   * Starts the `@WhileLeader` methods of this LockService's singletons. A request-scoped or
   * transient provider has no one instance to lead with (as `@nestjs/schedule` says of its jobs):
   * it is warned about and leads nothing.
   */
  private campaign(wrappers: readonly InstanceWrapper[]): void {
    const leaders = new Set<unknown>();
    for (const wrapper of wrappers) {
      if (wrapper.isTransient || !wrapper.isDependencyTreeStatic()) {
        if (hasLeaderMethods(wrapper.metatype) && !wrapper.isFactory) {
          new Logger('RedisLock').warn(
            `@WhileLeader on ${wrapper.metatype.name}, a ${wrapper.isTransient ? 'transient' : 'request-scoped'} provider, is ignored: it has no one instance to lead with. Make it a singleton.`,
          );
        }
        continue;
      }
      // One instance can stand behind several tokens (`useExisting`): it campaigns once.
      leaders.add(wrapper.instance);
    }
    for (const instance of leaders) startLeaderMethods(instance, this.locks);
  }

  /** Goes through modules `LazyModuleLoader` loads, as `onModuleInit` and bootstrap do. */
  private followLazyModules(): void {
    const lazy = this.lazy;
    if (!lazy) return;
    const load = lazy.load.bind(lazy);
    Object.defineProperty(lazy, 'load', {
      configurable: true,
      writable: true,
      value: async (...args: Parameters<LazyModuleLoader['load']>) => {
        const loaded = await load(...args);
        const modules = [...this.modules.values()].filter((module) => !this.adopted.has(module));
        for (const module of modules) this.adopted.add(module);
        const wrappers = wrappersOf(modules);
        this.equip(wrappers);
        this.stopLeadersFirst(wrappers);
        this.campaign(wrappers);
        return loaded;
      },
    });
  }

  private services(): Set<LockService> {
    return new Set(
      wrappersOf(this.modules.values())
        .flatMap(lastingInstances)
        .filter((instance): instance is LockService => instance instanceof LockService),
    );
  }
}
