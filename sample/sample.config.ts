import { Injectable } from '@nestjs/common';

/** The sample's settings, from the environment (tests override this provider). */
@Injectable()
export class SampleConfig {
  readonly redisUrl: string = process.env.REDIS_URL ?? 'redis://127.0.0.1:6379';
  readonly httpPort: number = Number(process.env.PORT ?? 3000);
  readonly microservicePort: number = Number(process.env.MICROSERVICE_PORT ?? 3001);
  /** How often the stock report job runs, in ms; 0 turns it off. */
  readonly reportInterval: number = Number(process.env.REPORT_INTERVAL ?? 30_000);
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
