import { AsyncLocalStorage } from 'node:async_hooks';
import type { Lock } from '../interfaces/lock.interface.js';
import { MultiKeyLock, type KeyHold } from './multi-key-lock.handle.js';
/** What a call chain holds: a key, or several. */
export type ChainLock = KeyHold | MultiKeyLock;

/**
 * The locks held by the current async call chain, innermost first. Frames are immutable: code
 * forked inside a lock sees it, siblings started elsewhere do not, so two unrelated requests in
 * one process never share a lock through here.
 */
interface LockFrame {
  /** The LockService that took the lock: re-entrancy never crosses apps in one process. */
  readonly owner: object;
  readonly lock: ChainLock;
  readonly parent: LockFrame | undefined;
}

const storage = new AsyncLocalStorage<LockFrame>();

/** Runs `fn` with `lock` added to the current call chain. */
export function runHoldingLock<T>(owner: object, lock: ChainLock, fn: () => T): T {
  return storage.run({ owner, lock, parent: storage.getStore() }, fn);
}

/**
 * Runs `fn` in a call chain that holds no lock, whatever the caller's holds: for work that outlives
 * the call that started it (a leadership's campaign), which must never re-enter the caller's lock.
 */
export function outsideLocks<T>(fn: () => T): T {
  return storage.exit(fn);
}

/**
 * The lock on `key` that `owner` holds in this call chain and has not released, if any (of a lock
 * on several keys, that key's own).
 */
export function findChainLock(owner: object, key: string): KeyHold | undefined {
  for (let frame = storage.getStore(); frame; frame = frame.parent) {
    if (frame.owner !== owner) continue;
    const lock = keyLock(frame.lock, key);
    if (lock) return lock;
  }
  return undefined;
}

/** Whether the current async call chain runs under `lock` (released since, or not). */
export function inChainOf(lock: object): boolean {
  for (let frame = storage.getStore(); frame; frame = frame.parent) {
    if (frame.lock === lock) return true;
  }
  return false;
}

/**
 * The lock held by the current call chain: the innermost one, or the one on `key` (of a lock on
 * several keys, that key's own, with that key's fence). Lets code running under `using()` or
 * `@WithLock` read its fencing token and `signal` without passing the lock around.
 * @example
 * const lock = getCurrentLock();
 * await ledger.write(entry, { fence: lock?.fence, signal: lock?.signal });
 */
export function getCurrentLock(key?: string): Lock | undefined {
  for (let frame = storage.getStore(); frame; frame = frame.parent) {
    const lock = key === undefined ? frame.lock : keyLock(frame.lock, key);
    if (lock && !lock.released) return lock;
  }
  return undefined;
}

/** The unreleased lock on `key` within `lock`. */
function keyLock(lock: ChainLock, key: string): KeyHold | undefined {
  const found =
    lock instanceof MultiKeyLock ? lock.handleOf(key) : lock.key === key ? lock : undefined;
  return found && !found.released ? found : undefined;
}
