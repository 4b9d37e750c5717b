import { Injectable } from '@nestjs/common';

/** The sample's settings, from the environment (tests override this provider). */
@Injectable()
export class SampleConfig {
  readonly redisUrl: string = process.env.REDIS_URL ?? 'redis://127.0.0.1:6379';
  readonly httpPort: number = Number(process.env.PORT ?? 3000);
  readonly microservicePort: number = Number(process.env.MICROSERVICE_PORT ?? 3001);
  /** How often the stock report job runs, in ms; 0 turns it off. */
  readonly reportInterval: number = Number(process.env.REPORT_INTERVAL ?? 30_000);
  /** Simulated payment authorisation time inside a purchase, in ms: the window a race needs. */
  readonly paymentDelay: number = Number(process.env.PAYMENT_DELAY ?? 20);

  constructor(overrides: Partial<SampleConfig> = {}) {
    Object.assign(this, overrides);
  }
}
