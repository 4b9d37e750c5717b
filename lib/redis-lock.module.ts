import {
  Logger,
  Module,
  type DynamicModule,
  Optional,
  type OnApplicationBootstrap,
  type OnModuleInit,
} from '@nestjs/common';
import { LazyModuleLoader, ModulesContainer } from '@nestjs/core';
import {
  followFactory,
  lastingInstances,
  madeByNest,
  runAfter,
  runBefore,
  wrappersOf,
  type InstanceWrapper,
  type NestModule,
} from './decorators/app-instances.js';
import {
  lockedInstance,
  lockServiceIn,
  provideLockService,
} from './decorators/lock-service.injection.js';
import { checkLockedMethods, warnAboutUnskippedJobs } from './decorators/with-lock.decorator.js';
import {
  checkLeaderMethods,
  hasLeaderMethods,
  startLeaderMethods,
} from './decorators/while-leader.decorator.js';
import { RedisLockConfigurationError } from './errors/redis-lock.errors.js';
import { LockService } from './lock.service.js';
import { ASYNC_OPTIONS_TYPE, ConfigurableModuleClass } from './redis-lock.module-definition.js';

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
  /** The instances whose `onModuleDestroy` stops this LockService's leaderships first. */
  private readonly guarded = new WeakSet<object>();
  /** Whether `@WhileLeader` methods campaign yet (once the app has started). */
  private started = false;

  /**
   * See the class comment. Refuses, naming what is missing, options that give none of
   * `useFactory`, `useClass` and `useExisting` (Nest would fail later, naming an internal token).
   */
  static override forRootAsync(options: typeof ASYNC_OPTIONS_TYPE): DynamicModule {
    const given = options as Partial<typeof ASYNC_OPTIONS_TYPE> | undefined;
    if (!given?.useFactory && !given?.useClass && !given?.useExisting) {
      throw new RedisLockConfigurationError(
        'forRootAsync',
        options,
        'give one of useFactory (with inject for what it needs), useClass or useExisting, for example forRootAsync({ inject: [ConfigService], useFactory: (config) => ({ connection: config.getOrThrow("REDIS_URL") }) })',
      );
    }
    return super.forRootAsync(options);
  }

  constructor(
    private readonly modules: ModulesContainer,
    private readonly locks: LockService,
    @Optional() private readonly lazy?: LazyModuleLoader,
  ) {
    super();
  }

  /**
   * Before any module's `onModuleInit` may call them, providers with `@WithLock` or `@WhileLeader`
   * methods that Nest injects nothing into (made by `useFactory`, given as `useValue`; singletons,
   * transient or request-scoped alike) are given this app's LockService; those made later, as
   * they are made. With several LockServices in the app, which one they should use is unknown: the
   * app fails to boot, naming the class (as it does for a `useValue` object another running app
   * uses). And every `onModuleDestroy` of the providers Nest made (classes and factories, with
   * controllers, guards and modules) first stops this LockService's leaderships, so that nothing a
   * leader's work uses is torn down while it still runs, whatever the order Nest destroys modules
   * in (the lock module's own hook runs last when it is global), also after a failed startup.
   * Modules loaded with `LazyModuleLoader` are gone through when they are loaded.
   */
  async onModuleInit(): Promise<void> {
    this.followLazyModules();
    try {
      this.refuseTwoGlobal();
      this.adopt([...this.modules.values()]);
      for (const instance of new Set(wrappersOf(this.modules.values()).flatMap(lastingInstances))) {
        const locks = lockedInstance(instance) ? lockServiceIn(instance) : undefined;
        // A test double of LockService may have neither.
        if (locks?.defaultTtl !== undefined && locks.maxKeyLength !== undefined) {
          checkLockedMethods(instance, locks);
        }
      }
    } catch (error) {
      // A failed init is not followed by a shutdown in every Nest version: close what is open.
      await Promise.all([...this.services()].map((service) => service.onApplicationShutdown()));
      throw error;
    }
  }

  /**
   * `@WhileLeader` methods campaign once every `onApplicationBootstrap` of the app has returned
   * (after the root module's, which Nest calls last), as `@nestjs/schedule` starts its jobs: a
   * leader's work never runs before the providers it uses are ready, nor in an app whose startup
   * failed.
   */
  onApplicationBootstrap(): void {
    const logger = new Logger('RedisLock');
    for (const instance of new Set(wrappersOf(this.modules.values()).flatMap(lastingInstances))) {
      warnAboutUnskippedJobs(instance, logger);
    }
    const start = (): void => {
      this.campaign(wrappersOf(this.modules.values()));
      this.started = true;
    };
    // The root module is the second Nest adds (after its InternalCoreModule), as Nest's own
    // distance calculation takes it.
    const root = [...this.modules.values()][1]?.instance as object | undefined;
    if (!root || !runAfter(root, 'onApplicationBootstrap', start)) start();
  }

  /**
   * Two global registrations in one app would each offer their LockService everywhere, and Nest
   * would give every module one of them without a word: which one (with its `keyPrefix`, its
   * Redis) is not for the library to guess.
   */
  private refuseTwoGlobal(): void {
    const global = [...this.modules.values()].filter(
      (module) => module.metatype === RedisLockModule && module.isGlobal,
    );
    if (global.length > 1) {
      throw new RedisLockConfigurationError(
        'isGlobal',
        true,
        `this app registers RedisLockModule with isGlobal ${global.length} times, so which LockService a module gets is undefined: register one of them globally and import the others (without isGlobal) into the modules that need them`,
      );
    }
  }

  /** Goes through `modules` (see `onModuleInit`); they count as adopted once that succeeded. */
  private adopt(modules: readonly NestModule[]): void {
    const wrappers = wrappersOf(modules);
    this.equip(wrappers);
    this.stopLeadersFirst(wrappers);
    for (const module of modules) this.adopted.add(module);
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
        let warned = false;
        followFactory(wrapper, (instance) => {
          give(instance, name);
          if (!warned && hasLeaderMethods((instance as object | undefined)?.constructor)) {
            warned = true;
            warnNoLeader(`the factory of ${name}`, wrapper);
          }
        });
      }
    }
  }

  /**
   * See `onModuleInit`. Not a `useValue` object's hook: you made it, and it may be another app's
   * too, whose shutdown would then stop this app's leaders.
   */
  private stopLeadersFirst(wrappers: readonly InstanceWrapper[]): void {
    const locks = this.locks as Partial<LockService>;
    if (typeof locks.onModuleDestroy !== 'function') return; // a test double
    const instances = new Set(
      wrappers.filter((wrapper) => wrapper.metatype || wrapper.isAlias).flatMap(lastingInstances),
    );
    for (const instance of instances) {
      if (instance instanceof LockService || this.guarded.has(instance)) continue;
      this.guarded.add(instance);
      runBefore(instance, 'onModuleDestroy', () => this.locks.onModuleDestroy());
    }
  }

  /** Starts the `@WhileLeader` methods of `wrappers`' singletons (see `leadersIn`). */
  private campaign(wrappers: readonly InstanceWrapper[]): void {
    for (const instance of this.leadersIn(wrappers)) startLeaderMethods(instance, this.locks);
  }

  /**
   * The singletons of `wrappers` that may lead, once each, all checked (a method that is also a
   * scheduler job fails the startup before anything campaigns). A request-scoped or transient
   * provider has no one instance to lead with (as `@nestjs/schedule` says of its jobs): it is
   * warned about and leads nothing.
   */
  private leadersIn(wrappers: readonly InstanceWrapper[]): Set<unknown> {
    const leaders = new Set<unknown>();
    for (const wrapper of wrappers) {
      if (wrapper.isTransient || !wrapper.isDependencyTreeStatic()) {
        if (hasLeaderMethods(wrapper.metatype) && !wrapper.isFactory) {
          warnNoLeader(wrapper.metatype.name, wrapper);
        }
        continue;
      }
      // One instance can stand behind several tokens (`useExisting`): it campaigns once.
      leaders.add(wrapper.instance);
    }
    for (const instance of leaders) checkLeaderMethods(instance);
    return leaders;
  }

  /**
   * Goes through modules `LazyModuleLoader` loads, as startup does; their `@WhileLeader` methods
   * campaign at once if the app has started, else with the others.
   */
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
        // Checked before they count as adopted: a load that failed here fails again if retried.
        const leaders = this.started ? this.leadersIn(wrappersOf(modules)) : new Set();
        this.adopt(modules);
        for (const instance of leaders) startLeaderMethods(instance, this.locks);
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

function warnNoLeader(what: string, wrapper: InstanceWrapper): void {
  new Logger('RedisLock').warn(
    `@WhileLeader on ${what}, a ${wrapper.isTransient ? 'transient' : 'request-scoped'} provider, is ignored: it has no one instance to lead with. Make it a singleton.`,
  );
}
