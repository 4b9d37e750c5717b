import type { Lock } from '../interfaces/lock.interface.js';
import { LockHandle, type LockOwnerHooks } from './lock.handle.js';
import type { LockReentry } from './lock.reentry.js';

/** A lock on one key a call chain may hold: its own, or a re-entry of one its caller holds. */
export type KeyHold = LockHandle | LockReentry;

/**
 * A lock on several keys at once (`acquire(['acct:1', 'acct:2'])`): one lock per key, all with
 * the same owner token, taken one after another in one global order (see `LockService`) and held
 * together. Each key keeps its own lease, fence, watchdog and release; this handle only joins
 * them: its `signal` aborts when any of them is lost, `release()` and `extend()` act on all. A key
 * lost ends the lock: the watchdogs of the keys it took stop then, so each lapses at its TTL unless
 * released first (a lost lock keeps nothing alive, even if its holder never releases it).
 */
export class MultiKeyLock implements Lock {
  readonly keys: readonly string[];
  readonly fences: Readonly<Record<string, number>>;
  private joinedSignal: AbortSignal | undefined;
  /** Stops listening for its keys' losses (see the constructor). */
  private readonly unlisten: (() => void)[] = [];

  /** `handles` in lock order; at least two. */
  constructor(private readonly handles: readonly KeyHold[]) {
    this.keys = Object.freeze(handles.map((handle) => handle.key));
    this.fences = Object.freeze(
      Object.fromEntries(handles.map((handle) => [handle.key, handle.fence])),
    );
    // Any key lost (a key re-entered from the caller's hold too: that hold lost or released while
    // this lock is inside) stops the watchdogs of the keys it took itself (a re-entered key's
    // watchdog is its outer hold's, which goes on).
    const own = handles.filter((handle) => handle instanceof LockHandle);
    if (own.some((handle) => handle.extendsItself)) {
      const stop = (): void => own.forEach((handle) => handle.stopWatchdog());
      this.unlisten = handles.map((handle) => handle.whenLost(stop));
    }
  }

  get key(): string {
    return this.handles[0].key;
  }

  get token(): string {
    return this.handles[0].token;
  }

  get fence(): number {
    return this.handles[0].fence;
  }

  get expiresAt(): number {
    return Math.min(...this.handles.map((handle) => handle.expiresAt));
  }

  /** Aborts with the `LockLostError` of the first key found lost. */
  get signal(): AbortSignal {
    return (this.joinedSignal ??= AbortSignal.any(this.handles.map((handle) => handle.signal)));
  }

  /** Why a key's lease ended early, without creating any signal. */
  get lossReason(): Error | undefined {
    for (const handle of this.handles) if (handle.lossReason) return handle.lossReason;
    return undefined;
  }

  /** True once every key has been released. */
  get released(): boolean {
    return this.handles.every((handle) => handle.released);
  }

  /** The lock of one of the keys, if this lock holds it. */
  handleOf(key: string): KeyHold | undefined {
    return this.handles.find((handle) => handle.key === key);
  }

  /** Whether every key's lock was taken by the service these hooks belong to. */
  belongsTo(hooks: LockOwnerHooks): boolean {
    return this.handles.every((handle) => handle.belongsTo(hooks));
  }

  /**
   * Releases every key (at once, each bounded by `commandTimeout`). Resolves `false` if any was no
   * longer ours; rejects with the first failure only after every release has been tried.
   */
  async release(): Promise<boolean> {
    this.stopListening();
    return every(this.handles.map((handle) => handle.release()));
  }

  /** Gives back every key after no work ran: see `LockHandle.undo`. */
  async undo(): Promise<boolean> {
    this.stopListening();
    return every(this.handles.map((handle) => handle.undo()));
  }

  /**
   * Extends every key. Rejects (`LockLostError`) if any is no longer ours, after trying all; at
   * once, extending none, if one is known lost already.
   */
  async extend(ttl?: number): Promise<void> {
    // (A lease that ran out unobserved counts as lost here.)
    for (const handle of this.handles) handle.stillHeld();
    const lost = this.lossReason;
    if (lost) throw lost;
    await every(this.handles.map((handle) => handle.extend(ttl).then(() => true)));
  }

  private stopListening(): void {
    for (const unlisten of this.unlisten.splice(0)) unlisten();
  }
}

/** Waits for all; rejects with the first failure, else resolves whether every one was true. */
async function every(pending: Promise<boolean>[]): Promise<boolean> {
  const results = await Promise.allSettled(pending);
  const failed = results.find((result) => result.status === 'rejected');
  if (failed) throw failed.reason;
  return results.every((result) => result.status === 'fulfilled' && result.value);
}
