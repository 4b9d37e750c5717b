import type { AcquireAttempt, Handoff } from '../interfaces/lock-backend.interface.js';
import type { ResolvedAcquireOptions } from '../options/acquire-options.js';
import type { EngineParts } from './engine.parts.js';
import { LockHandle } from './lock.handle.js';

/**
 * A lease granted on `key` (by an attempt or a handoff, `sentAt` when it was asked for): the
 * handle, among the held locks.
 */
export function holdGranted(
  parts: EngineParts,
  key: string,
  token: string,
  attempt: Extract<AcquireAttempt, { acquired: true }>,
  sentAt: number,
  opts: ResolvedAcquireOptions,
  handoff?: Handoff,
): LockHandle {
  const handle = new LockHandle(
    key,
    token,
    attempt.fence,
    opts.ttl,
    sentAt,
    sentAt + attempt.validity,
    opts.autoExtend,
    parts.hooks,
    opts.shape,
    attempt.fenceLimit,
    handoff?.swap,
    handoff?.confirmedAt,
  );
  if (opts.holdAtLeast > 0) handle.holdFor(opts.holdAtLeast);
  parts.held.push(handle);
  return handle;
}

/** The `acquired` event, built only when someone listens. */
export function reportAcquired({ events }: EngineParts, handle: LockHandle, started: number): void {
  if (!events.observed) return;
  const waitedMs = performance.now() - started;
  events.emit({ type: 'acquired', key: handle.key, fence: handle.fence, waitedMs });
}
