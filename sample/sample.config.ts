import { Injectable } from '@nestjs/common';

/** The sample's settings, from the environment (tests override this provider). */
@Injectable()
export class SampleConfig {
  readonly redisUrl: string = process.env.REDIS_URL ?? 'redis://127.0.0.1:6379';
  readonly httpPort: number = Number(process.env.PORT ?? 3000);
  readonly microservicePort: number = Number(process.env.MICROSERVICE_PORT ?? 3001);
  /** Whether the stock report job runs on its schedule (every 30 s); `REPORTS=off` turns it off. */
  readonly reports: boolean = process.env.REPORTS !== 'off';
  /** How often the leader checks for low stock, in ms. */
  readonly monitorInterval: number = Number(process.env.MONITOR_INTERVAL ?? 5_000);
  /** Below this many items a SKU is reported as low. */
  readonly lowStock: number = Number(process.env.LOW_STOCK ?? 3);
  /** Simulated payment authorisation time inside a purchase, in ms: the window a race needs (0: none). */
  readonly paymentDelay: number = Number(process.env.PAYMENT_DELAY ?? 20);
  /** TTL of the purchase locks, in ms (the module's `defaults.ttl`; they are auto-extended). */
  readonly lockTtl: number = Number(process.env.LOCK_TTL ?? 5_000);
  /** How long a purchase waits for a busy SKU before answering 409, in ms. */
  readonly lockWait: number = Number(process.env.LOCK_WAIT ?? 2_000);

  constructor(overrides: Partial<SampleConfig> = {}) {
    Object.assign(this, overrides);
  }
}
