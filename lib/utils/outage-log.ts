import type { Logger } from '@nestjs/common';

/**
 * The log of a failure that repeats while an outage lasts (a campaign attempt every
 * `retryInterval`): one warning when it starts, one summary per `summaryMs` while it lasts, and
 * one line when it ends, instead of a warning per attempt.
 */
export class OutageLog {
  /** When the current outage began (`undefined`: none). */
  private since: number | undefined = undefined;
  private failures = 0;
  private lastLine = 0;

  constructor(
    private readonly logger: Logger,
    /** What fails, as the start of a sentence: `Campaign for leadership of "k"`. */
    private readonly what: string,
    private readonly summaryMs = 60_000,
    private readonly now: () => number = () => performance.now(),
  ) {}

  /** Whether an outage is going on (a failure not yet followed by `recovered()`). */
  get failing(): boolean {
    return this.since !== undefined;
  }

  /** One more failure; `next`: what happens next (`trying again every 100 ms`). */
  failed(error: unknown, next: string): void {
    const now = this.now();
    this.failures++;
    if (this.since === undefined) {
      this.since = this.lastLine = now;
      this.logger.warn(
        `${this.what} failed; ${next} (a summary every ${Math.round(this.summaryMs / 1_000)} s while it fails, and a line when it works again): ${String(error)}`,
      );
    } else if (now - this.lastLine >= this.summaryMs) {
      this.lastLine = now;
      this.logger.warn(
        `${this.what} still fails after ${seconds(now - this.since)} (${this.failures} attempts): ${String(error)}`,
      );
    }
  }

  /** It worked: ends the outage, if there was one, with a line saying so. */
  recovered(): void {
    if (this.since === undefined) return;
    this.logger.log(
      `${this.what} works again after ${seconds(this.now() - this.since)} (${this.failures} failed attempts)`,
    );
    this.since = undefined;
    this.failures = 0;
  }
}

function seconds(ms: number): string {
  return `${(ms / 1_000).toFixed(1)} s`;
}
