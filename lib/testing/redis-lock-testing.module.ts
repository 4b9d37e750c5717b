import type { DynamicModule, Provider } from '@nestjs/common';
import { RedisLockConfigurationError } from '../errors/redis-lock.errors.js';
import type { RedisLockModuleOptions } from '../interfaces/redis-lock-options.interface.js';
import { BACKEND_SOURCE, type BackendOf } from '../options/module-options.js';
import { MODULE_OPTIONS_TOKEN } from '../redis-lock.module-definition.js';
import { RedisLockModule } from '../redis-lock.module.js';
import { InMemoryLockBackend } from './in-memory-lock.backend.js';
import { InMemoryLockStore } from './in-memory-lock.store.js';

/** Options of `RedisLockTestingModule.forRoot()`: the module's, without those of a Redis. */
export interface RedisLockTestingOptions extends Omit<
  RedisLockModuleOptions,
  'client' | 'connection' | 'nodes' | 'driftFactor' | 'replicaAck'
> {
  /** Makes `LockService` injectable everywhere, as `RedisLockModule`'s `isGlobal`. */
  isGlobal?: boolean;
  /**
   * Where the locks are kept. Apps of one test given the same store contend for the same locks,
   * as instances of an app on one Redis do.
   * @default a store of this module's own
   */
  store?: InMemoryLockStore;
}

/**
 * `RedisLockModule` without Redis, for unit tests: the same `LockService`, `@WithLock` and
 * `@WhileLeader`, run by the same engine (TTLs, auto-extension, fences, re-entry, every lock
 * shape, several keys, `onBusy`, `holdAtLeast`, leadership, events), over locks kept in this
 * process's memory (`InMemoryLockStore`) instead of Redis. What it cannot show: other processes,
 * and Redis's faults (a slow or lost connection, a restart, a failover).
 * @example
 * const moduleRef = await Test.createTestingModule({
 *   imports: [RedisLockTestingModule.forRoot()],
 *   providers: [OrdersService],
 * }).compile();
 */
export class RedisLockTestingModule {
  /**
   * The module, with `RedisLockModule`'s options but those of a Redis (`client`, `connection`,
   * `nodes`, `driftFactor`, `replicaAck`: refused, `RedisLockConfigurationError`).
   */
  static forRoot(options: RedisLockTestingOptions = {}): DynamicModule {
    const { store = new InMemoryLockStore(), isGlobal = false, ...rest } = options;
    if (!(store instanceof InMemoryLockStore)) {
      throw new RedisLockConfigurationError(
        'store',
        store,
        'must be an InMemoryLockStore (new InMemoryLockStore()), shared by the apps that contend for its locks',
      );
    }
    const create: BackendOf = (resolved) => new InMemoryLockBackend(store, resolved);
    // RedisLockModule's own module, with the in-memory backend as its only source (see BACKEND_SOURCE).
    const module = RedisLockModule.forRoot({ ...rest, isGlobal });
    const providers = (module.providers ?? []).map((provider): Provider =>
      typeof provider === 'object' &&
      'provide' in provider &&
      provider.provide === MODULE_OPTIONS_TOKEN
        ? { provide: MODULE_OPTIONS_TOKEN, useValue: { ...rest, [BACKEND_SOURCE]: create } }
        : provider,
    );
    return { ...module, providers };
  }
}
