import type { Logger } from '@nestjs/common';
import type { LockBackend } from '../interfaces/lock-backend.interface.js';
import type { ResolvedDefaults } from '../options/defaults.js';
import type { LinkedList } from '../utils/linked-list.js';
import type { LockOwnerHooks, LockHandle } from './lock.handle.js';
import type { LockEvents } from './lock.events.js';
import type { Replies } from './replies.js';
import type { Waiters } from './waiters.js';

/** What the engine's parts share: one set per `LockEngine` (one per `LockService`). */
export interface EngineParts {
  readonly backend: LockBackend;
  readonly defaults: ResolvedDefaults;
  readonly commandTimeout: number;
  readonly logger: Logger;
  readonly events: LockEvents;
  readonly replies: Replies;
  /** What every lock handle of this engine reports to (and how a lock is told to be ours). */
  readonly hooks: LockOwnerHooks;
  /**
   * Locks taken through this engine and neither released nor lost: a `LinkedList`, which they
   * enter and leave without allocating.
   */
  readonly held: LinkedList<LockHandle>;
  /** Aborts when shutdown begins. */
  readonly stopping: AbortSignal;
  /** The callers waiting for locks, held to `maxWaiters`. */
  readonly waiters: Waiters;
}
