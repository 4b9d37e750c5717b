import type { HeldLease, PendingSwap } from '../interfaces/lock-backend.interface.js';
import type { LockCommands } from './lock-commands.js';
import type { Heir } from './channel.subscription.js';
import type { WriteBatcher } from './write-batcher.js';

/** What a handoff needs of the backend it releases for. */
export interface HandoffHost {
  /** See `RedisLockBackend.validity`. */
  validity(ttl: number): number;
  /** See `RedisLockBackend.counterTtl`. */
  counterTtl(ttl: number): number;
  /** See `KeyLayout.counterKey`. */
  counterKey(lockKey: string): string;
  /** Releases a plain lock (the heir's, when the heir gave up before it took what it was handed). */
  release(key: string, token: string): Promise<boolean>;
}

/**
 * Whether `lease` may be handed on in the process without a round trip (see `passOn`): held to
 * the end, a fence of its block left, at least half the heir's TTL left to run, so that the
 * heir's own write lands well within it, and confirmed by Redis since a connection to it was last
 * lost (`connectionLostAt`): a master that failed over or restarted empty meanwhile may have
 * forgotten the lease and granted the key to another process, with a fence from its clock above
 * the block's; through Redis, the heir learns the lock is gone before it starts.
 */
export const passable = (lease: HeldLease, heirTtl: number, connectionLostAt: number): boolean =>
  lease.lossReason === undefined &&
  lease.confirmedAt > connectionLostAt &&
  lease.fence < lease.fenceLimit &&
  lease.expiresAt - performance.now() >= heirTtl / 2;

/**
 * Whether the releaser of `lease` surely still holds its lock where its release lands: its lease
 * outlasts `margin` (the longest the release waits for its answer; a later one fails it), and
 * Redis keeps a lock at least as long as its lease. Then no other caller's attempt can have taken
 * the key before the release's write, and the release may be handed to a waiter whose attempt is
 * on its way (see `firstInLine`): that attempt fails, and a release that answers `true` found the
 * lock its own. With less left, the key may lapse while the write travels, that attempt take it,
 * and the handoff find the heir's own token (as after a resend) and answer `true` for a lock that
 * had lapsed (a helper saw it through a jittery link, 11 of 150 releases with 1–5 ms left). Without
 * a lease (an undo, an orphaned handoff's release): no.
 */
export const holding = (lease: HeldLease | undefined, margin: number): boolean =>
  lease !== undefined &&
  lease.lossReason === undefined &&
  lease.expiresAt - performance.now() > margin;

/**
 * Resolves in the event loop's check phase, after every promise reaction queued until then: a
 * lock passed on in the process lets its heir start before the write that tells Redis (a system
 * call) is made.
 */
const afterReactions = (): Promise<void> => new Promise((resolve) => setImmediate(resolve));

/**
 * A release that goes straight to the first waiter of this process (its `heir`): with one round
 * trip (`handOff`) or, while the releaser's lease has room, none (`passOn`).
 */
export class InProcessHandoff {
  constructor(
    private readonly commands: LockCommands,
    private readonly batcher: WriteBatcher | undefined,
    /** Fences per grant from Redis to a generated token (see `RedisLockBackend.stride`). */
    private readonly stride: number,
    private readonly host: HandoffHost,
  ) {}

  /**
   * Releases the lock straight to `heir`, the first waiter of this process: one command instead of
   * a release, a message and the waiter's attempt. If the lock was no longer ours, or Redis did not
   * answer, the heir goes back to trying by itself; if the heir gave up meanwhile without the
   * lock, the lock it was handed is released for it.
   */
  async handOff(key: string, lockKey: string, token: string, heir: Heir): Promise<boolean> {
    const { token: heirToken, ttl } = heir.claim;
    const sentAt = performance.now();
    let fence: number;
    try {
      const command = this.stride > 1 ? 'redisLockHandoff' : 'redisLockHandoffUnreserved';
      fence = await this.commands[command](
        lockKey,
        this.host.counterKey(lockKey),
        token,
        heirToken,
        ttl,
        this.host.counterTtl(ttl),
      );
    } catch (error) {
      heir.wake();
      throw error;
    }
    if (fence === 0) {
      heir.wake();
      return false;
    }
    const fenceLimit = fence + this.stride - 1;
    heir.grant({ fence, fenceLimit, validity: this.host.validity(ttl), sentAt }, () => {
      this.host.release(key, heirToken).catch(() => {
        // It expires after its TTL.
      });
    });
    return true;
  }

  /**
   * Hands the lock to `heir`, the first waiter of this process, without waiting for Redis: the
   * heir starts at once with the next fence of the block `lease`'s grant reserved (so no holder
   * anywhere else can get it), on what is left of `lease` but no more than its own TTL's lease,
   * while the write of its token and TTL over ours (`PASS_ON_SCRIPT`) goes out behind it, after
   * our own if that is still in flight.
   * That write then counts as the heir's first extension: if it finds the lock no longer ours,
   * the heir has lost it (its `signal` aborts), and its own extensions and release wait for it.
   * Resolves, like a release, whether the lock was still ours.
   */
  passOn(
    key: string,
    lockKey: string,
    token: string,
    heir: Heir,
    lease: HeldLease,
  ): Promise<boolean> {
    const { token: heirToken, ttl } = heir.claim;
    const counterTtl = this.host.counterTtl(ttl);
    const counterKey = this.host.counterKey(lockKey);
    const send = (): PendingSwap => {
      const sentAt = performance.now();
      this.batcher?.beforeSend();
      return this.commands
        .redisLockPassOn(lockKey, counterKey, token, heirToken, ttl, counterTtl)
        .then((swapped) => (swapped === 1 ? sentAt : undefined));
    };
    // Sent once the heir has run up to its first wait (see `afterReactions`), unless it goes
    // behind our own write, still in flight.
    const swap = lease.swap
      ? lease.swap.then((sent) => (sent === undefined ? undefined : send()))
      : afterReactions().then(send);
    const now = performance.now();
    const { fence, fenceLimit, expiresAt, confirmedAt } = lease;
    // What is left of our lease, but never more than the heir's own: once its write lands, Redis
    // lets the key go after the heir's TTL, however late the reply that would correct the lease.
    // Rounded down to the µs: the heir's lease ends at `now + validity`, which in floating point
    // comes out a fraction of a ns above `expiresAt` for about 1 in 20 leases while the process is
    // younger than the lease (a loaded gate run: "the heir's lease ends 0 ms after the releaser's").
    const left = Math.floor((expiresAt - now) * 1_000) / 1_000;
    const validity = Math.min(left, this.host.validity(ttl));
    heir.grant({ fence: fence + 1, fenceLimit, validity, sentAt: now, swap, confirmedAt }, () => {
      swap
        .then((sent) => sent !== undefined && this.host.release(key, heirToken))
        .catch(() => {
          // It expires after its TTL.
        });
    });
    return swap.then((sent) => sent !== undefined);
  }
}
