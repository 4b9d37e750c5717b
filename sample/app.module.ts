import { Global, Module } from '@nestjs/common';
import { RedisLockModule } from '../lib/index.js';
import { InventoryModule } from './inventory/inventory.module.js';
import { JobsModule } from './jobs/jobs.module.js';
import { RedisConnection } from './redis.provider.js';
import { SampleConfig } from './sample.config.js';

@Global()
@Module({
  providers: [{ provide: SampleConfig, useFactory: () => new SampleConfig() }, RedisConnection],
  exports: [SampleConfig, RedisConnection],
})
class SampleCoreModule {}

@Module({
  imports: [
    SampleCoreModule,
    // The lock module borrows the app's connection (and never closes it); isGlobal lets every
    // feature module use LockService and @WithLock without importing it again.
    RedisLockModule.forRootAsync({
      isGlobal: true,
      inject: [RedisConnection, SampleConfig],
      useFactory: (redis: RedisConnection, config: SampleConfig) => ({
        client: redis.client,
        keyPrefix: 'sample:lock:',
        // Per-environment lock timing for every @WithLock that does not set its own.
        defaults: { ttl: config.lockTtl, acquireTimeout: config.lockWait },
      }),
    }),
    InventoryModule,
    JobsModule,
  ],
})
export class AppModule {}
