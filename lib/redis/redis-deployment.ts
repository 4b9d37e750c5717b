import { randomBytes } from 'node:crypto';
import type { Logger } from '@nestjs/common';
import type { Cluster, Redis } from 'ioredis';
import type {
  BackendHealth,
  HandoffClaim,
  ReleaseSubscription,
} from '../interfaces/lock-backend.interface.js';
import type { ResolvedModuleOptions } from '../options/module-options.js';
import {
  closeQuietly,
  describeFailure,
  explainFailure,
  unreachable,
  onConnectionLoss,
  onReconnect,
  pingHealth,
  serverInfo,
  versionProblem,
  type ServerInfo,
} from './connections.js';
import { RedisLockConfigurationError } from '../errors/redis-lock.errors.js';
import { InFlight } from '../utils/in-flight.js';
import { probeRights } from './rights-probe.js';
import { KeyLayout } from './key-layout.js';
import { ShardedPubSubChoice } from './pub-sub.choice.js';
import { ReleaseNotifier } from './release.notifier.js';

/** The key the startup check of the user's rights locks nothing under (see `checkRights`). */
const PROBE_KEY = 'nestjs-redis-lock:probe';

/**
 * One Redis deployment reached through one ioredis client, as the lock operations stand on it:
 * where a lock's keys live (`KeyLayout`), how its releases are heard (`ReleaseNotifier`, sharded
 * on a Cluster where it can be), and the connection's life: startup, health, reconnections,
 * close. `RedisLockBackend` adds the lock operations.
 */
export abstract class RedisDeployment {
  protected readonly layout: KeyLayout;
  protected readonly notifier: ReleaseNotifier;
  protected readonly isCluster: boolean;
  /** Cluster: whether releases use sharded pub/sub (see `ShardedPubSubChoice`). */
  protected readonly shardedPubSub: (() => Promise<boolean>) | undefined;
  /** Longest wait for a reply (and for QUIT when closing a connection). */
  protected readonly commandTimeout: number;
  readonly replyTimeout: number;
  /**
   * When a connection to the deployment last closed (`performance.now()`; see `onConnectionLoss`):
   * Redis may have failed over or restarted empty since, and forgotten locks it confirmed before.
   */
  protected connectionLostAt = -Infinity;
  /**
   * This module's name in the queues of processes waiting for a plain lock (see `JOIN_TURNS`):
   * a release names the process whose waiters try next.
   */
  protected readonly processId = randomBytes(8).toString('base64url');
  /**
   * Writes that closing must not cut off (see `close`): releases, and what they orphaned. A
   * release is tagged with its key, for a give-up of that key to wait for it (see `leave`).
   */
  protected readonly writes = new InFlight<string | undefined>();
  private readonly stopWatchingLosses: () => void;

  /** See `LockBackend.explain`. */
  explain(error: unknown): unknown {
    return explainFailure(this.client, error);
  }

  /** See `LockBackend.unreachable`. */
  unreachable(): string | undefined {
    return unreachable(this.client);
  }

  constructor(
    protected readonly client: Redis | Cluster,
    options: Pick<ResolvedModuleOptions, 'keyPrefix' | 'commandTimeout'> &
      Partial<Pick<ResolvedModuleOptions, 'handoffTurn'>>,
    /** Whether the backend created the client, and so must close it. */
    private readonly ownsClient: boolean,
    protected readonly logger: Logger,
  ) {
    this.isCluster = (client as { isCluster?: boolean }).isCluster === true;
    const clientPrefix = (client.options as { keyPrefix?: string }).keyPrefix ?? '';
    if (this.isCluster) assertClusterPrefix(clientPrefix);
    this.layout = new KeyLayout(options.keyPrefix, this.isCluster, clientPrefix);
    this.commandTimeout = this.replyTimeout = options.commandTimeout;
    this.shardedPubSub = this.isCluster
      ? new ShardedPubSubChoice(client as Cluster, this.commandTimeout, logger).sharded
      : undefined;
    this.notifier = new ReleaseNotifier(
      [client],
      this.commandTimeout,
      logger,
      this.shardedPubSub,
      options.handoffTurn,
      this.processId,
    );
    this.stopWatchingLosses = onConnectionLoss(client, () => {
      this.connectionLostAt = performance.now();
    });
  }

  /**
   * Startup, within `commandTimeout`: refuses a server older than the scripts need (see
   * `versionProblem`; one that does not answer in time is not checked) and a Redis user that may
   * not run what the locks need (see `checkRights`), and on a Cluster asks how releases are
   * announced.
   * @throws RedisLockConfigurationError naming the server's version
   */
  async prepare(): Promise<void> {
    // Asked beside the version (a Redis that does not answer costs one commandTimeout, not two).
    const rights = this.checkRights();
    rights.catch(() => undefined); // awaited below, unless the version is refused first
    const [info] = await Promise.all([
      this.serverInfo(),
      this.shardedPubSub?.().catch((error: unknown) => {
        this.logger.warn(
          `Cluster: could not ask the servers how to announce releases at startup (${describeFailure(error, this.commandTimeout)}); deciding at the first lock release or wait.`,
        );
      }),
    ]);
    const problem = versionProblem(info.version);
    if (problem)
      throw new RedisLockConfigurationError('Redis server', `Redis ${info.version}`, problem);
    await rights;
  }

  /**
   * Startup: refuses a Redis user that may not run what the locks need (see `probeRights`),
   * naming what Redis refused; one that may not publish on the lock channels is a warning: the
   * locks work, waiters in other processes poll. `where` names the Redlock node (` of nodes[i]`).
   * @throws RedisLockConfigurationError naming the commands
   */
  async checkRights(where = ''): Promise<void> {
    // One commandTimeout in all: a Cluster that did not say how it announces releases in time
    // used it up, and is not checked (the first lock tells).
    const deadline = performance.now() + this.commandTimeout;
    const lockKey = this.layout.lockKey(PROBE_KEY);
    const sharded = (await this.shardedPubSub?.().catch(() => false)) ?? false;
    const left = deadline - performance.now();
    if (left < 1) return;
    const rights = await probeRights(
      this.client,
      [lockKey, `${lockKey}:queue`, `${lockKey}:probe`, this.layout.counterKey(lockKey)],
      this.layout.releaseChannel(lockKey),
      sharded ? 'SPUBLISH' : 'PUBLISH',
      left,
    );
    if (!rights) return;
    if (rights.refused.length > 0) {
      throw new RedisLockConfigurationError(
        `Redis user${where}`,
        undefined,
        `Redis refused what the locks need (${rights.refused.join('; ')}): grant the user the keys and channels of the keyPrefix and the commands of the ACL recipe (see "Least-privilege Redis user" in the topologies guide)`,
      );
    }
    if (rights.channelRefused) {
      this.logger.warn(
        `The Redis user${where} may not publish on the lock channels (${this.layout.releaseChannel(lockKey)}): the locks work, but waiters in other processes find a free key at their next timed attempt (every retryInterval) instead of at once. Grant the channels of the keyPrefix (&<keyPrefix>*): see the ACL recipe.`,
      );
    }
  }

  /** See `serverInfo`. */
  serverInfo(): Promise<ServerInfo> {
    return serverInfo(this.client, this.commandTimeout);
  }

  health(): Promise<BackendHealth> {
    return pingHealth(this.client, this.commandTimeout);
  }

  async isLocked(key: string): Promise<boolean> {
    return (await this.client.exists(this.layout.lockKey(key))) === 1;
  }

  onReconnect(listener: () => void): () => void {
    return onReconnect(this.client, listener);
  }

  hasWaiters(key: string): boolean {
    return this.notifier.watching && this.notifier.isWatched(this.releaseChannel(key));
  }

  takesTurns(key: string): boolean {
    return this.notifier.watching && this.notifier.takesTurns(this.releaseChannel(key));
  }

  watchReleases(key: string, claim?: HandoffClaim, turnOf?: string): ReleaseSubscription {
    const channel =
      turnOf === undefined
        ? this.releaseChannel(key)
        : this.layout.turnChannel(this.layout.lockKey(key), turnOf);
    return this.notifier.watch(channel, claim);
  }

  /** The channel on which releases of `key` are announced. */
  releaseChannel(key: string): string {
    return this.layout.releaseChannel(this.layout.lockKey(key));
  }

  /** See `LockBackend.close`. */
  async close(deadline = performance.now() + this.commandTimeout): Promise<void> {
    this.stopWatchingLosses();
    const closing = this.notifier.close(deadline);
    await this.writes.drain(deadline);
    if (this.ownsClient) await closeQuietly(this.client, deadline - performance.now());
    await closing;
  }
}

/**
 * A Cluster client's own ioredis `keyPrefix` goes in front of every key ioredis sends: a hash tag
 * of its own (`{app}:`) puts every lock's keys in that one slot, which works (the channels follow
 * it, see `KeyLayout`); a brace that opens no complete, non-empty tag within it (`app{`, `{}`)
 * would take over the lock's own tag, so that a lock's keys land in different slots and every
 * script fails with CROSSSLOT. Refused at startup, naming it.
 * @throws RedisLockConfigurationError
 */
function assertClusterPrefix(prefix: string): void {
  const open = prefix.indexOf('{');
  if (open < 0 || prefix.indexOf('}', open + 1) > open + 1) return;
  throw new RedisLockConfigurationError(
    'client.options.keyPrefix',
    prefix,
    "on a Cluster, a client's keyPrefix must hold no brace, or one complete hash tag ('{app}:'): this one breaks the hash tags that keep each lock's keys in one slot",
  );
}
