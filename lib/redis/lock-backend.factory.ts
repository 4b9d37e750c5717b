import type { Logger } from '@nestjs/common';
import type { LockBackend } from '../interfaces/lock-backend.interface.js';
import type { ResolvedModuleOptions } from '../options/module-options.js';
import { createClient } from './connections.js';
import { RedisLockBackend } from './redis-lock.backend.js';
import { RedlockBackend } from './redlock.backend.js';

/**
 * The backend for the module's Redis source: one deployment through one client (`client`, or a
 * client created for `connection`, which it then owns), or Redlock across `nodes`.
 */
export function createLockBackend(options: ResolvedModuleOptions, logger: Logger): LockBackend {
  const { source } = options;
  switch (source.kind) {
    case 'client':
      return new RedisLockBackend(source.client, options, false, logger);
    case 'connection':
      return new RedisLockBackend(createClient(source.connection, logger), options, true, logger);
    case 'nodes':
      return RedlockBackend.create(source, options, logger);
    case 'backend':
      return source.create(options);
  }
}
