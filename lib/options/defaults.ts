/** The built-in defaults and limits of every option: the single place they are written down. */

import type { KeyView } from '../errors/redis-lock.errors.js';
import type { LockDefaults } from '../interfaces/redis-lock-options.interface.js';

/** The built-in defaults: the single place they are written down. */
export const DEFAULT_KEY_PREFIX = 'lock:';

/**
 * Default `maxKeyLength`: a key names a resource (`order:<uuid>`, a few ids joined: tens of
 * characters); 512 leaves room for long compound names and still keeps a request body out of
 * Redis and out of every log line.
 */
export const DEFAULT_MAX_KEY_LENGTH = 512;

/**
 * Default `maxWaiters`: how many callers of one `LockService` may wait at once, for one key and
 * in all. Measured (`npm run bench:waiters`): a waiter takes ~3.5 kB of heap; waiters of one key
 * sleep until a release (20,000 of them: 3 % of a core, event-loop p99 unchanged), but each key
 * with waiters has one that retries every `retryInterval`, so waiters of distinct keys cost CPU:
 * 1,000 keys 6.9 % of a core, 5,000 keys 17.5 % and an event-loop p99 of 21 ms, 20,000 keys
 * 54 % and 148 ms (medians of 3 rounds). 5,000 in all keeps a flood under a fifth of a core;
 * 1,000 per key leaves room for other keys when one is flooded (and its last waiter waits a
 * thousand holds).
 */
export const DEFAULT_MAX_WAITERS = { perKey: 1_000, perProcess: 5_000 } as const;

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
 * to another process costs a release, a message and that process's attempt (~0.5–1.3 ms), so the
 * longer the turn, the fewer switches and the shorter the handoff gaps, and the longer a waiter in
 * another process may wait. Chosen by what callers wait: the turn with the lowest wait p99 whose
 * sections/s stay at least the hand-written minimum's. Measured side by side (`npm run bench`,
 * hot key, 1 ms sections, no think time, 5 rounds, turns of 25, 50, 100 and 250 ms): with 2, 4
 * and 8 processes × 10 workers, 25 ms kept 1.00–1.02× the minimum's sections/s (250 ms:
 * 1.01–1.13×) for a wait p99 of 44–46, 583 and 1,260 ms (250 ms: 266–267, 1,027 and 2,837 ms).
 */
export const DEFAULT_HANDOFF_TURN = 25;

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
  /** The module's `maxKeyLength` (a top-level option), which every call's keys are checked against. */
  maxKeyLength: number;
  /** How keys are shown in messages, log lines and events (the module's `logKeys`). */
  keyView: KeyView;
};

export const DEFAULTS_KEYS = Object.keys(DEFAULT_LOCK_DEFAULTS);
