import { Logger } from '@nestjs/common';
import { Redis, type Cluster } from 'ioredis';
import type { RedisSource } from '../redis-lock.options.js';
import type {
  AcquireAttempt,
  LockBackend,
  ReleaseSubscription,
} from '../interfaces/lock-backend.interface.js';
import {
  ACQUIRE_SCRIPT,
  EXTEND_SCRIPT,
  FENCE_RETENTION_MS,
  RELEASE_SCRIPT,
} from './lock.scripts.js';
import { closeQuietly, ReleaseNotifier } from './release.notifier.js';

/** The script commands this backend defines on its client (EVALSHA with EVAL fallback). */
interface LockCommands {
  redisLockAcquire(
    lockKey: string,
    fenceKey: string,
    token: string,
    ttl: number,
    retention: number,
  ): Promise<[number, number]>;
  redisLockExtend(
    lockKey: string,
    fenceKey: string,
    token: string,
    ttl: number,
    retention: number,
  ): Promise<number>;
  redisLockRelease(lockKey: string, token: string, channel: string): Promise<number>;
}

/**
 * Locks on one Redis deployment reached through one ioredis client: a standalone server, a
 * Sentinel-managed master, or a Cluster.
 *
 * Key layout for key `K` with prefix `P`: the lock is `P{K}` (value: owner token), its fence
 * counter `P{K}:fence`, and releases are announced on channel `P{K}:released`. The hash tag
 * keeps all three in one cluster slot.
 */
export class RedisLockBackend implements LockBackend {
  private readonly commands: LockCommands;
  private readonly notifier: ReleaseNotifier;

  constructor(
    private readonly client: Redis | Cluster,
    private readonly keyPrefix: string,
    /** Whether this backend created the client, and so must close it. */
    private readonly ownsClient: boolean,
    logger: Logger,
  ) {
    client.defineCommand('redisLockAcquire', { numberOfKeys: 2, lua: ACQUIRE_SCRIPT });
    client.defineCommand('redisLockExtend', { numberOfKeys: 2, lua: EXTEND_SCRIPT });
    client.defineCommand('redisLockRelease', { numberOfKeys: 1, lua: RELEASE_SCRIPT });
    this.commands = client as unknown as LockCommands;
    this.notifier = new ReleaseNotifier(client, logger);
  }

  /** Builds the backend for the module's Redis source, creating (and then owning) the client if asked to. */
  static create(source: RedisSource, keyPrefix: string, logger: Logger): RedisLockBackend {
    if (source.kind === 'client')
      return new RedisLockBackend(source.client, keyPrefix, false, logger);
    // lazyConnect: no socket is opened before the first lock command, so an app whose bootstrap
    // fails later never leaks a connection it cannot close.
    const client =
      typeof source.connection === 'string'
        ? new Redis(source.connection, { lazyConnect: true })
        : new Redis({ ...source.connection, lazyConnect: true });
    client.on('error', (error: Error) => logger.warn(`Redis connection: ${error.message}`));
    return new RedisLockBackend(client, keyPrefix, true, logger);
  }

  async tryAcquire(key: string, token: string, ttl: number): Promise<AcquireAttempt> {
    const lockKey = this.lockKey(key);
    const [acquired, value] = await this.commands.redisLockAcquire(
      lockKey,
      `${lockKey}:fence`,
      token,
      ttl,
      FENCE_RETENTION_MS,
    );
    if (acquired === 1) return { acquired: true, fence: value, validity: ttl };
    return { acquired: false, retryAfter: value >= 0 ? value : undefined };
  }

  async extend(key: string, token: string, ttl: number): Promise<boolean> {
    const lockKey = this.lockKey(key);
    const extended = await this.commands.redisLockExtend(
      lockKey,
      `${lockKey}:fence`,
      token,
      ttl,
      FENCE_RETENTION_MS,
    );
    return extended === 1;
  }

  async release(key: string, token: string): Promise<boolean> {
    const lockKey = this.lockKey(key);
    return (await this.commands.redisLockRelease(lockKey, token, `${lockKey}:released`)) === 1;
  }

  async isLocked(key: string): Promise<boolean> {
    return (await this.client.exists(this.lockKey(key))) === 1;
  }

  watchReleases(key: string): ReleaseSubscription {
    return this.notifier.watch(`${this.lockKey(key)}:released`);
  }

  async close(): Promise<void> {
    await this.notifier.close();
    if (this.ownsClient) await closeQuietly(this.client);
  }

  private lockKey(key: string): string {
    return `${this.keyPrefix}{${key}}`;
  }
}
