/** `nestjs-redis-lock/health`: the Terminus health indicator (needs `@nestjs/terminus`). */
export { RedisLockHealthIndicator } from './redis-lock.health.js';
