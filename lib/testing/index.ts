/**
 * `nestjs-redis-lock/testing`: `RedisLockTestingModule`, the lock module without Redis for unit
 * tests, and the `InMemoryLockStore` it keeps locks in.
 */
export { InMemoryLockStore } from './in-memory-lock.store.js';
export {
  RedisLockTestingModule,
  type RedisLockTestingOptions,
} from './redis-lock-testing.module.js';
