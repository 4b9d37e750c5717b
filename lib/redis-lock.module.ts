import { Logger, Module, type OnApplicationBootstrap, type OnModuleInit } from '@nestjs/common';
import { ModulesContainer } from '@nestjs/core';
import { lacksLockService, provideLockService } from './decorators/lock-service.injection.js';
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
  constructor(
    private readonly modules: ModulesContainer,
    private readonly locks: LockService,
  ) {
    super();
  }

  /**
   * A provider with `@WithLock` or `@WhileLeader` methods made by `useFactory` or given as `useValue` gets no
   * property injection from Nest: it is given this app's LockService here, before any module's
   * `onModuleInit` may call it. With several LockServices in the app, which one it should use is
   * unknown: the app fails to boot, naming the class.
   */
  async onModuleInit(): Promise<void> {
    const wrappers = this.providers();
    const services = new Set(
      wrappers
        .map((wrapper): unknown => wrapper.instance)
        .filter((instance) => instance instanceof LockService),
    );
    for (const wrapper of wrappers) {
      const instance: unknown = wrapper.isDependencyTreeStatic() ? wrapper.instance : undefined;
      if (!lacksLockService(instance)) continue;
      if (services.size > 1) {
        // A failed init is not followed by a shutdown in every Nest version: close what is open.
        await Promise.all([...services].map((service) => service.onApplicationShutdown()));
        throw new RedisLockConfigurationError(
          `@WithLock/@WhileLeader(${instance.constructor.name})`,
          wrapper.name,
          'this provider is made by useFactory or given as useValue, so Nest injects nothing into it, and the app has several LockServices to choose from: provide the class itself (`providers: [MyService]` or `useClass`)',
        );
      }
      provideLockService(instance, this.locks);
    }
  }

  /**
   * Once every module is initialised (the lock service's own startup done), starts campaigning for
   * the `@WhileLeader` methods of this LockService's providers, as `@nestjs/schedule` starts its
   * jobs; `LockService.onModuleDestroy` stops them at shutdown.
   */
  onApplicationBootstrap(): void {
    const wrappers = this.providers();
    // A request-scoped or transient provider has no instance to lead with (as @nestjs/schedule
    // says of its jobs).
    for (const wrapper of wrappers) {
      if (!wrapper.isDependencyTreeStatic() && hasLeaderMethods(wrapper.metatype)) {
        new Logger('RedisLock').warn(
          `@WhileLeader on ${wrapper.metatype.name}, a request-scoped or transient provider, is ignored: make it a singleton to campaign from bootstrap.`,
        );
      }
    }
    // One instance can stand behind several tokens (`useExisting`): it campaigns once.
    const instances = new Set(
      wrappers
        .filter((wrapper) => wrapper.isDependencyTreeStatic())
        .map((wrapper): unknown => wrapper.instance),
    );
    for (const instance of instances) startLeaderMethods(instance, this.locks);
  }

  private providers() {
    return [...this.modules.values()].flatMap((module) => [...module.providers.values()]);
  }
}
