import { Injectable } from '@nestjs/common';
import { HealthIndicatorService, type HealthIndicatorResult } from '@nestjs/terminus';
import { LockService } from '../lock.service.js';

/**
 * A `@nestjs/terminus` health indicator for the Redis behind the locks. List it in the providers
 * of the module whose controller runs the health checks (the module that imports `TerminusModule`);
 * `LockService` must be injectable there (`isGlobal: true`, or import the module that registers
 * `RedisLockModule`).
 * @example
 * @Get('health') @HealthCheck()
 * check() { return this.health.check([() => this.redisLock.isHealthy('locks')]); }
 */
@Injectable()
export class RedisLockHealthIndicator {
  constructor(
    private readonly indicators: HealthIndicatorService,
    private readonly locks: LockService,
  ) {}

  /**
   * Up when Redis answers a PING within the module's `commandTimeout` (Redlock: while a majority
   * of the nodes do, with each node's status in `nodes`); down otherwise, with the error. Settles
   * within `commandTimeout`, also when Redis is gone.
   * @param key the name of this check in the health report
   */
  async isHealthy(key = 'redis-lock'): Promise<HealthIndicatorResult> {
    const indicator = this.indicators.check(key);
    const { up, details } = await this.locks.checkHealth();
    return up ? indicator.up(details) : indicator.down(details);
  }
}
