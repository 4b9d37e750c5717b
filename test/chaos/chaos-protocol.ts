/** What the chaos runner and its workers say to each other. Times are ms on the system-wide monotonic clock. */

/** An address as ioredis takes it in `sentinels`, Cluster startup nodes and `natMap`. */
export interface Address {
  host: string;
  port: number;
}

/**
 * How a worker reaches the lock servers: always through its own fault proxies, one in front of
 * each lock server. Cluster and Sentinel announce the servers' own addresses, so the worker maps
 * them to its proxies with ioredis' `natMap` (`host:port` of a server → its proxy).
 */
export type WorkerLock =
  /** One Redis: the sample's own connection (which the lock module borrows) through the proxy. */
  | { mode: 'standalone'; url: string }
  /** Redlock across the proxies (`nodes`); the sample's own data on the first. */
  | { mode: 'redlock'; urls: string[] }
  /** The worker's own ioredis `Cluster` (`client`), as an app passes one. */
  | { mode: 'cluster'; startupNodes: Address[]; natMap: Record<string, Address> }
  /** A `connection` the module creates: the Sentinels (reached directly) name the master. */
  | { mode: 'sentinel'; sentinels: Address[]; name: string; natMap: Record<string, Address> };

/**
 * The key every worker campaigns for with `LockService.lead()`: the leader runs sections on it
 * back to back for as long as it leads, so faults meet a leader as they meet any holder.
 */
export const LEADER_KEY = 'leader:chaos';

export interface WorkerConfig {
  slot: number;
  lock: WorkerLock;
  /** The healthy Redis holding the fence-guarded resource. */
  dbPort: number;
  keys: string[];
  loops: number;
  ttl: number;
  acquireTimeout: number;
  /** Section work, ms [min, max]; `longWorkRatio` of sections take `longWorkMs` instead (the watchdog extends them). */
  workMs: [number, number];
  longWorkMs: [number, number];
  longWorkRatio: number;
  /** Share of calls that go through the sample's @WithLock route instead of LockService.using(). */
  routeRatio: number;
  /**
   * Share of the using() calls that take a semaphore place (limit 2 or 3 on one key: mixed limits
   * meet) or a read or write lock, on keys of their own (`sem:<key>`, `rw:<key>`).
   */
  shapeRatio: number;
  thinkMs: number;
  /** A call still pending after this long did not settle within its bound. */
  callBoundMs: number;
}

/** What a section holds: the plain lock (none), a semaphore place with its limit, a read or write lock. */
export type SectionShape = { limit: number } | 'read' | 'write';

export type ChaosEvent =
  | { t: 'ready'; pid: number; slot: number }
  | {
      t: 'enter';
      id: string;
      key: string;
      fence: number;
      path: 'using' | 'route';
      at: number;
      /** From the call to the section (using() path): the acquire latency. */
      waited?: number;
      /** The hold it runs in (a token's start): re-entered and forked sections share it. */
      hold: string;
      /** Entered this long after the lock's `expiresAt`, its signal not aborted yet. */
      overdue?: number;
      shape?: SectionShape;
      /** One key of a lock on several keys (see `Section.multi`). */
      multi?: boolean;
    }
  | {
      t: 'exit';
      id: string;
      at: number;
      /** When `lock.signal` aborted, if it did while the section ran. */
      abortAt?: number;
      /** When the lock's lease had run out, as its holder last knew it (`expiresAt`), at the abort. */
      leaseEnd?: number;
      reason?: string;
      wrote: 'accepted' | 'rejected' | 'skipped';
      /**
       * When it aborted: the longest the worker's event loop stood still from a TTL before the
       * section to the abort, ms (a lease lost to a stall of its own process, not to a fault).
       */
      worstTick?: number;
    }
  | {
      t: 'call';
      path: 'using' | 'route';
      outcome: string;
      start: number;
      ms: number;
      /** Over the bound, and the worker was not frozen (SIGSTOP) or starved meanwhile. */
      unsettled: boolean;
      /** The worker's event loop stood still for over 250 ms during the call. */
      stalled: boolean;
      /** The longest the worker's event loop stood still during the call, ms. */
      worstTick: number;
      /** A failed call's error (see `Call.detail`). */
      detail?: string;
    }
  /** The section's lock signal aborted after the section ended (at the release, say). */
  | { t: 'signal'; id: string; at: number; worstTick: number; leaseEnd: number }
  | { t: 'unhandled'; error: string }
  | {
      t: 'summary';
      unhandled: number;
      shutdownMs: number;
      pauses: number;
      logs: { warn: number; error: number };
    };

/**
 * The resource's guard, as a database would check fences: KEYS[1] the resource (a hash holding
 * the highest fence accepted), KEYS[2] the log of accepted fences; ARGV[1] the writer's fence.
 * Accepts a fence at least as high as every fence accepted before, and rejects (and counts) any
 * lower one. One script, so the check and the write are one step.
 */
export const GUARD_SCRIPT = `
local last = tonumber(redis.call('HGET', KEYS[1], 'fence') or '0')
if tonumber(ARGV[1]) < last then
  redis.call('HINCRBY', KEYS[1], 'rejected', 1)
  return 0
end
redis.call('HSET', KEYS[1], 'fence', ARGV[1])
redis.call('RPUSH', KEYS[2], ARGV[1])
return 1
`;

/**
 * Records when this process's event loop stood still for over 250 ms (a 20 ms ticker ran late): a
 * process frozen by SIGSTOP or starved of CPU cannot keep its own time.
 */
export function stallRecorder(): {
  /** Whether a stall overlapped the interval `from`–`to`. */
  overlap(from: number, to: number): boolean;
  /** The longest the event loop stood still (ms) during `from`–`to`, shorter stalls included. */
  worst(from: number, to: number): number;
  count(): number;
  stop(): void;
} {
  const now = (): number => Number(process.hrtime.bigint()) / 1e6;
  const stalls: [number, number][] = [];
  // The last ticks over 25 ms (a 20 ms timer over 5 ms late), for `worst`: a timer due during
  // such a gap fired up to its length late.
  const lags: [number, number][] = [];
  let last = now();
  const ticker = setInterval(() => {
    const t = now();
    if (t - last > 250) stalls.push([last, t]);
    if (t - last > 25) {
      lags.push([last, t]);
      if (lags.length > 4_000) lags.splice(0, 2_000);
    }
    last = t;
  }, 20);
  return {
    overlap: (from, to) => stalls.some(([start, end]) => start < to && end > from),
    worst: (from, to) =>
      Math.max(
        20,
        ...lags.filter(([start, end]) => start < to && end > from).map(([s, e]) => e - s),
      ),
    count: () => stalls.length,
    stop: () => clearInterval(ticker),
  };
}
