/** The built-in defaults and limits of every option: the single place they are written down. */

import type { LockDefaults } from '../interfaces/redis-lock-options.interface.js';

/** The built-in defaults: the single place they are written down. */
export const DEFAULT_KEY_PREFIX = 'lock:';

export const DEFAULT_LOCK_DEFAULTS = {
  ttl: 10_000,
  acquireTimeout: 5_000,
  autoExtend: undefined,
  retryInterval: 1_000,
  retryJitter: 50,
} as const satisfies Required<Omit<LockDefaults, 'autoExtend'>> & { autoExtend: undefined };

/**
 * Longest wait for any one Redis reply, in ms. A lock script runs in microseconds and a healthy
 * Redis answers within a few ms even across zones; 1 s leaves room for a first connection (TCP,
 * TLS, AUTH, script load) while staying well under the default TTL, so a hung extension still
 * leaves the watchdog more tries before the lease runs out.
 */
export const DEFAULT_COMMAND_TIMEOUT = 1_000;

/**
 * Default `fenceRetention`: the fence counter outlives every lock it fenced by one minute. While it
 * lives, fences keep growing through any server clock step back (NTP steps are usually well under
 * a second); one counter serves every key (one per hash slot on a Cluster), so its length costs
 * no memory per key.
 */
export const DEFAULT_FENCE_RETENTION = 60_000;

/**
 * Default `handoffTurn`: how long one process may pass a contended lock among its own waiters
 * (ms, from the first handoff of its turn) before a release frees it for waiters in other
 * processes. A handoff within a process costs no round trip (~0.03 ms between sections); a switch
 * to another process costs a release, a message and that process's attempt (~0.4–0.6 ms), so the
 * longer the turn, the fewer switches, the shorter the handoff gaps and the higher the throughput,
 * and the longer a waiter in another process may wait for its turn. Measured side by side
 * (`npm run bench`, hot key, 2 processes × 10 workers, 1 ms sections, no think time): turns of
 * 25, 100, 150 and 250 ms gave a handoff gap p99 of 0.47, 0.45, 0.45 and 0.19 ms (the best peer's
 * 0.56–0.89 in the same runs), a wait p99 of 45, 116, 167 and 266 ms (the peers' 550–1,060).
 * Only turns of 250 ms kept the switches (0.5 % of handoffs) out of the gap's p99.
 */
export const DEFAULT_HANDOFF_TURN = 250;

/**
 * Default `driftFactor` in Redlock mode: a lock's validity is `ttl - ttl * driftFactor - 2 ms`,
 * the margin the Redlock description gives for clocks of the nodes running at different rates.
 */
export const DEFAULT_DRIFT_FACTOR = 0.01;

/** Fewest independent masters in Redlock mode: with fewer, one node down stops all locking. */
export const MIN_REDLOCK_NODES = 3;

/** Largest duration accepted: Node timers fire at once beyond 2^31 - 1 ms (~24.8 days). */
export const MAX_DURATION = 2_147_483_647;

export type ResolvedDefaults = Omit<Required<LockDefaults>, 'autoExtend'> & {
  autoExtend: boolean | undefined;
};

export const DEFAULTS_KEYS = Object.keys(DEFAULT_LOCK_DEFAULTS);
