import type { Logger } from '@nestjs/common';
import type { Cluster } from 'ioredis';
import { within } from '../utils/within.js';

/**
 * Cluster: whether releases are announced with SPUBLISH on the node that owns the key's slot
 * (Redis >= 7 and an ioredis that routes SSUBSCRIBE, >= 5.6) rather than with PUBLISH, which the
 * cluster bus copies to every node. Decided when the app starts (`prepare`) or, if the cluster
 * could not be reached then, on first need; logged, and kept.
 */
export class ShardedPubSubChoice {
  private choice: Promise<boolean> | undefined;

  constructor(
    private readonly client: Cluster,
    private readonly commandTimeout: number,
    private readonly logger: Logger,
  ) {}

  /** Whether releases use sharded pub/sub: asked once, asked again after a failure. */
  readonly sharded = (): Promise<boolean> =>
    (this.choice ??= this.choose().catch((error: unknown) => {
      this.choice = undefined;
      throw error;
    }));

  private async choose(): Promise<boolean> {
    const info = await within(this.client.info('server'), this.commandTimeout, []);
    const version = /redis_version:(\S+)/.exec(info)?.[1] ?? 'unknown';
    const probe = this.client.duplicate(undefined, {
      lazyConnect: true,
      shardedSubscribers: true,
    });
    const routes =
      (probe as unknown as { shardedSubscribers?: unknown }).shardedSubscribers !== undefined;
    probe.disconnect();
    const { sharded, note } = pubSubChoice(version, routes);
    if (sharded) this.logger.log(note);
    else this.logger.warn(note);
    return sharded;
  }
}

/**
 * How a Cluster announces releases, given the server's `redis_version` and whether this ioredis
 * routes SSUBSCRIBE to the node that owns a slot; `note` says which and why, for the log.
 */
export function pubSubChoice(
  serverVersion: string,
  ioredisRoutes: boolean,
): { sharded: boolean; note: string } {
  const major = Number.parseInt(serverVersion, 10);
  if (!(major >= 7)) {
    return {
      sharded: false,
      note: `Cluster: release notifications use classic pub/sub, which every node carries: Redis ${serverVersion} has no sharded pub/sub (Redis >= 7.0 has).`,
    };
  }
  if (!ioredisRoutes) {
    return {
      sharded: false,
      note: 'Cluster: release notifications use classic pub/sub, which every node carries: this ioredis cannot subscribe to sharded channels in a Cluster (ioredis >= 5.6 can). Every app instance must make the same choice to hear the others.',
    };
  }
  return {
    sharded: true,
    note: `Cluster: release notifications use sharded pub/sub (SPUBLISH / SSUBSCRIBE on the node that owns each key; Redis ${serverVersion}).`,
  };
}
