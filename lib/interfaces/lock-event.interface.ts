import type { LockLostReason } from '../errors/redis-lock.errors.js';

/**
 * What `LockService.events` reports. Every event names the key (without the module's
 * `keyPrefix`; with `logKeys: 'hashed'` or `'hidden'`, as log lines show it); none carries the owner token. Times are in ms, measured on this process's
 * monotonic clock.
 */
export type LockEvent =
  /** A lock was taken (not a re-entry): `waitedMs` from the call to holding it. */
  | { type: 'acquired'; key: string; fence: number; waitedMs: number }
  /** A lock was released by its holder, or by the module on shutdown (`shutdown: true`). */
  | { type: 'released'; key: string; fence: number; heldMs: number; shutdown: boolean }
  /** A held lock's TTL was reset to `ttl`, by `extend()` or the watchdog. */
  | { type: 'extended'; key: string; fence: number; ttl: number }
  /**
   * A held lock was lost or could not be confirmed: `lock.signal` aborted with this `reason`. Not
   * on shutdown: that is a `released` event with `shutdown: true`.
   */
  | {
      type: 'lost';
      key: string;
      fence: number;
      heldMs: number;
      reason: Exclude<LockLostReason, 'shutdown' | 'released'>;
    }
  /**
   * An operator freed `key` with `LockService.forceRelease()` (in this process), naming `reason`:
   * `holders` holders of shape `mode` were freed (0 and `null`: it was free); `fence` the force's
   * own (see `ForcedRelease.fence`).
   */
  | {
      type: 'forced';
      key: string;
      reason: string;
      mode: 'exclusive' | 'semaphore' | 'read' | null;
      holders: number;
      fence: number;
    }
  /** `acquire()`, `using()` or `@WithLock` gave up after `acquireTimeout`; `tryAcquire()` found it held. */
  | { type: 'timeout'; key: string; waitedMs: number }
  /**
   * A `@WithLock({ onBusy: 'skip' })` call found the key held by another holder and skipped (the
   * method was not run): the normal life of a job on several instances, not a failure.
   */
  | { type: 'skipped'; key: string; waitedMs: number }
  /** A leadership's term began: this instance (participant `id`) leads `key` with term `fence`. */
  | { type: 'elected'; key: string; id: string; fence: number }
  /**
   * A leadership's term ended, `heldMs` after it began: its work settled (`'settled'`; the
   * campaign goes on), its lock was lost or could not be confirmed (`'lost'`), or `stop()` or the
   * shutdown gave it up (`'stop'`, `'shutdown'`).
   */
  | {
      type: 'deposed';
      key: string;
      id: string;
      fence: number;
      heldMs: number;
      reason: 'settled' | 'lost' | 'stop' | 'shutdown';
    };
