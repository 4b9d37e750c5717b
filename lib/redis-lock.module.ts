import { Module } from '@nestjs/common';
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
export class RedisLockModule extends ConfigurableModuleClass {}
