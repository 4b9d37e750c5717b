import { Inject, Injectable, Logger, type OnApplicationShutdown } from '@nestjs/common';
import { Redis } from 'ioredis';
import { SampleConfig } from './sample.config.js';

/** The app's own Redis connection: stock lives here, and RedisLockModule borrows it. */
@Injectable()
export class RedisConnection implements OnApplicationShutdown {
  readonly client: Redis;

  constructor(@Inject(SampleConfig) config: SampleConfig) {
    this.client = new Redis(config.redisUrl, { lazyConnect: true });
    // Without a listener ioredis prints every connection error with its stack; log one line.
    const logger = new Logger('Redis');
    this.client.on('error', (error: Error) => logger.warn(`Redis connection: ${error.message}`));
  }

  // The lock module never closes a client it was given: the app does, after the module is done.
  async onApplicationShutdown(): Promise<void> {
    await this.client.quit().catch(() => this.client.disconnect());
  }
}
