import { FAIR_RELEASE_COMMANDS, type LockCommands } from './lock-commands.js';
import type { KeyLayout } from './key-layout.js';
import type { WriteBatcher } from './write-batcher.js';

/**
 * Fair locks' queue in Redis (see `ACQUIRE_FAIR_SCRIPT`): a release that tells the next in line
 * it is its turn, and a waiter that leaves the queue.
 */
export class FairQueue {
  constructor(
    private readonly commands: LockCommands,
    private readonly batcher: WriteBatcher | undefined,
    private readonly layout: KeyLayout,
    /** Cluster: whether releases use sharded pub/sub (see `ShardedPubSubChoice`). */
    private readonly sharded: (() => Promise<boolean>) | undefined,
  ) {}

  /** A fair lock's release (`releasing`) or a waiter leaving its queue: see `fairRelease` script. */
  async release(
    lockKey: string,
    token: string,
    releasing: boolean,
    message: string,
  ): Promise<number> {
    const sharded = this.sharded !== undefined && (await this.sharded());
    const command = FAIR_RELEASE_COMMANDS[sharded ? 1 : 0];
    this.batcher?.beforeSend();
    return this.commands[command](
      lockKey,
      this.layout.ownFenceKey(lockKey),
      ...this.layout.queueKeys(lockKey),
      token,
      message,
      releasing ? 1 : 0,
      this.layout.turnChannels(lockKey),
    );
  }
}
