/** Which `maxWaiters` limit a caller would pass: see `Waiters.enter`. */
export type WaiterLimit = 'perKey' | 'perProcess';

/**
 * The callers of one `LockService` waiting for locks, per key and in all, held to `maxWaiters`: a
 * caller beyond either limit fails at once instead of waiting (a flood of requests for one key,
 * or for many, costs a bounded amount of memory, timers and subscriptions).
 */
export class Waiters {
  private total = 0;
  private readonly perKey = new Map<string, number>();

  constructor(private readonly limits: { readonly perKey: number; readonly perProcess: number }) {}

  /**
   * Counts a caller that starts waiting for `key`, unless that would pass a limit: then nothing
   * is counted and the limit is returned. Each counted caller must `leave()` once.
   */
  enter(key: string): WaiterLimit | undefined {
    const passed = this.passed(key);
    if (passed) return passed;
    this.perKey.set(key, (this.perKey.get(key) ?? 0) + 1);
    this.total++;
    return undefined;
  }

  /** Whether one more caller waiting for `key` would pass a limit (nothing is counted). */
  full(key: string): boolean {
    return this.passed(key) !== undefined;
  }

  /** The limit one more caller waiting for `key` would pass, if any. */
  private passed(key: string): WaiterLimit | undefined {
    if ((this.perKey.get(key) ?? 0) >= this.limits.perKey) return 'perKey';
    if (this.total >= this.limits.perProcess) return 'perProcess';
    return undefined;
  }

  leave(key: string): void {
    const count = this.perKey.get(key) ?? 0;
    if (count <= 1) this.perKey.delete(key);
    else this.perKey.set(key, count - 1);
    this.total--;
  }

  /** The limit `which` (for messages). */
  limit(which: WaiterLimit): number {
    return this.limits[which];
  }
}
