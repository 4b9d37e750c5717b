import { LockLostError } from './errors/redis-lock.errors.js';
import type { LockShape } from './interfaces/lock-backend.interface.js';
import type { Lock } from './interfaces/lock.interface.js';
import type { LockHandle, LockOwnerHooks } from './lock.handle.js';

/**
 * A re-entry of a held lock by a call nested in its holder's flow: a view of the outer hold, not
 * a second one. It reads the outer lock's fence, lease and `signal`; its `release()` ends only the
 * view (`true` once if the lock is still held, then `false`) and never touches Redis; extending it
 * extends the outer lock while the view is open. The outer holder's release ends the lock, however
 * many views were forgotten.
 */
export class LockReentry implements Lock {
  private ended = false;

  constructor(private readonly hold: LockHandle) {}

  get key(): string {
    return this.hold.key;
  }

  get keys(): readonly string[] {
    return this.hold.keys;
  }

  get token(): string {
    return this.hold.token;
  }

  get fence(): number {
    return this.hold.fence;
  }

  get fences(): Readonly<Record<string, number>> {
    return this.hold.fences;
  }

  get expiresAt(): number {
    return this.hold.expiresAt;
  }

  get signal(): AbortSignal {
    return this.hold.signal;
  }

  /** @internal What the outer lock holds. */
  get shape(): LockShape {
    return this.hold.shape;
  }

  /** @internal Why the outer lock's lease ended early, without creating its signal. */
  get lossReason(): LockLostError | undefined {
    return this.hold.lossReason;
  }

  /** True once this view was released, or the outer lock was. */
  get released(): boolean {
    return this.ended || this.hold.released;
  }

  /** Whether the outer lock was created by the service that `hooks` belong to. */
  belongsTo(hooks: LockOwnerHooks): boolean {
    return this.hold.belongsTo(hooks);
  }

  /** Re-enters the outer lock again, from a call nested in this view's flow. */
  enter(): LockReentry {
    return this.hold.enter();
  }

  /** Ends this view: whether the lock was still held, once; `false` after. Redis is not asked. */
  release(): Promise<boolean> {
    if (this.ended) return Promise.resolve(false);
    this.ended = true;
    return Promise.resolve(this.hold.stillHeld());
  }

  extend(ttl?: number): Promise<void> {
    if (this.released) {
      return Promise.reject(new LockLostError(this.key, this.token, 'not-held'));
    }
    return this.hold.extend(ttl);
  }
}
