import { AsyncLocalStorage } from 'node:async_hooks';
import type { Lock } from './interfaces/lock.interface.js';
import type { LockHandle } from './lock.handle.js';

/**
 * The locks held by the current async call chain, innermost first. Frames are immutable: code
 * forked inside a lock sees it, siblings started elsewhere do not, so two unrelated requests in
 * one process never share a lock through here.
 */
interface LockFrame {
  /** The LockService that took the lock: re-entrancy never crosses apps in one process. */
  readonly owner: object;
  readonly lock: LockHandle;
  readonly parent: LockFrame | undefined;
}

const storage = new AsyncLocalStorage<LockFrame>();

/** Runs `fn` with `lock` added to the current call chain. */
export function runHoldingLock<T>(owner: object, lock: LockHandle, fn: () => T): T {
  return storage.run({ owner, lock, parent: storage.getStore() }, fn);
}

/** The lock on `key` that `owner` holds in this call chain and has not released, if any. */
export function findChainLock(owner: object, key: string): LockHandle | undefined {
  return innermost((lock, frameOwner) => frameOwner === owner && lock.key === key);
}

/**
 * The lock held by the current call chain: the innermost one, or the one on `key`. Lets code
 * running under `using()` or `@WithLock` read its fencing token and `signal` without passing the
 * lock around.
 * @example
 * const lock = getCurrentLock();
 * await ledger.write(entry, { fence: lock?.fence, signal: lock?.signal });
 */
export function getCurrentLock(key?: string): Lock | undefined {
  return innermost((lock) => key === undefined || lock.key === key);
}

/** The innermost unreleased lock of the call chain that matches. */
function innermost(matches: (lock: LockHandle, owner: object) => boolean): LockHandle | undefined {
  for (let frame = storage.getStore(); frame; frame = frame.parent) {
    if (!frame.lock.released && matches(frame.lock, frame.owner)) return frame.lock;
  }
  return undefined;
}
