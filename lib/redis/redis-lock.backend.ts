import { Logger } from '@nestjs/common';
import { Redis, type Cluster, type RedisOptions } from 'ioredis';
import { LockReplicationError } from '../errors/redis-lock.errors.js';
import type { ReplicaAck } from '../interfaces/redis-lock-options.interface.js';
import type { ResolvedModuleOptions } from '../redis-lock.options.js';
import type {
  AcquireAttempt,
  BackendHealth,
  HandoffClaim,
  HeldLease,
  LockBackend,
  LockShape,
  PendingSwap,
  ReleaseSubscription,
} from '../interfaces/lock-backend.interface.js';
import { DEFAULT_DRIFT_FACTOR, PLAIN } from '../redis-lock.options.js';
import {
  ACQUIRE_ALL_SCRIPT,
  ACQUIRE_FAIR_SCRIPT,
  ACQUIRE_OWN_TOKEN_SCRIPT,
  ACQUIRE_READ_SCRIPT,
  ACQUIRE_SCRIPT,
  ACQUIRE_SEMAPHORE_SCRIPT,
  EXTEND_READ_SCRIPT,
  EXTEND_SCRIPT,
  EXTEND_SEMAPHORE_SCRIPT,
  FENCE_STRIDE,
  HANDOFF_SCRIPT,
  HANDOFF_UNRESERVED_SCRIPT,
  IS_HELD_SCRIPT,
  DROP_MARK_SCRIPT,
  PASS_ON_SCRIPT,
  RAISE_FENCE_SCRIPT,
  RELEASE_FORGETTING_SCRIPT,
  RELEASE_FAIR_FORGETTING_SCRIPT,
  RELEASE_FAIR_FORGETTING_SHARDED_SCRIPT,
  RELEASE_FAIR_SCRIPT,
  RELEASE_FAIR_SHARDED_SCRIPT,
  RELEASE_FORGETTING_SHARDED_SCRIPT,
  RELEASE_READ_FORGETTING_SCRIPT,
  RELEASE_READ_FORGETTING_SHARDED_SCRIPT,
  RELEASE_READ_SCRIPT,
  RELEASE_READ_SHARDED_SCRIPT,
  RELEASE_SCRIPT,
  RELEASE_SEMAPHORE_FORGETTING_SCRIPT,
  RELEASE_SEMAPHORE_FORGETTING_SHARDED_SCRIPT,
  RELEASE_SEMAPHORE_SCRIPT,
  RELEASE_SEMAPHORE_SHARDED_SCRIPT,
  RELEASE_SHARDED_SCRIPT,
} from './lock.scripts.js';
import { DEADLINE, within } from '../utils/within.js';
import { closeQuietly, watchConnection } from './connections.js';
import { ReleaseNotifier, type Heir } from './release.notifier.js';
import { WriteBatcher } from './write-batcher.js';
import { lockScripts, type ScriptDefinition } from './lock-scripts.runner.js';

/** KEYS (see `keysOf`), then token, channel, message. */
type ReleaseCommand = (...args: LockScriptArgs) => Promise<number>;

/**
 * The shapes' script families: the plain lock, a semaphore, a read lock (see `familyOf`). The
 * plain lock's here is for the caller's own token; a generated token's is `redisLockAcquire`.
 */
const ACQUIRE_COMMANDS = [
  'redisLockAcquireOwnToken',
  'redisLockAcquireSemaphore',
  'redisLockAcquireRead',
] as const;
const EXTEND_COMMANDS = [
  'redisLockExtend',
  'redisLockExtendSemaphore',
  'redisLockExtendRead',
] as const;
/** Release commands by [family][sharded pub/sub][fence counter deleted], and their scripts. */
const RELEASE_COMMANDS = [
  [
    ['redisLockRelease', 'redisLockReleaseForgetting'],
    ['redisLockReleaseSharded', 'redisLockReleaseForgettingSharded'],
  ],
  [
    ['redisLockReleaseSemaphore', 'redisLockReleaseSemaphoreForgetting'],
    ['redisLockReleaseSemaphoreSharded', 'redisLockReleaseSemaphoreForgettingSharded'],
  ],
  [
    ['redisLockReleaseRead', 'redisLockReleaseReadForgetting'],
    ['redisLockReleaseReadSharded', 'redisLockReleaseReadForgettingSharded'],
  ],
] as const;
const RELEASE_SCRIPTS = [
  [
    [RELEASE_SCRIPT, RELEASE_FORGETTING_SCRIPT],
    [RELEASE_SHARDED_SCRIPT, RELEASE_FORGETTING_SHARDED_SCRIPT],
  ],
  [
    [RELEASE_SEMAPHORE_SCRIPT, RELEASE_SEMAPHORE_FORGETTING_SCRIPT],
    [RELEASE_SEMAPHORE_SHARDED_SCRIPT, RELEASE_SEMAPHORE_FORGETTING_SHARDED_SCRIPT],
  ],
  [
    [RELEASE_READ_SCRIPT, RELEASE_READ_FORGETTING_SCRIPT],
    [RELEASE_READ_SHARDED_SCRIPT, RELEASE_READ_FORGETTING_SHARDED_SCRIPT],
  ],
] as const;

/**
 * Whether `lease` may be handed on in the process without a round trip (see `passOn`): held to
 * the end, a fence of its block left, and at least half the heir's TTL left to run, so that the
 * heir's own write lands well within it.
 */
const passable = (lease: HeldLease, heirTtl: number): boolean =>
  lease.lossReason === undefined &&
  lease.fence < lease.fenceLimit &&
  lease.expiresAt - performance.now() >= heirTtl / 2;

/**
 * Resolves in the event loop's check phase, after every promise reaction queued until then: a
 * lock passed on in the process lets its heir start before the write that tells Redis (a system
 * call) is made.
 */
const afterReactions = (): Promise<void> => new Promise((resolve) => setImmediate(resolve));

/** 0: the plain lock (a writer), 1: a place in a counting semaphore, 2: a read lock. */
const familyOf = (shape: LockShape): 0 | 1 | 2 =>
  shape.mode === 'read' ? 2 : shape.limit > 1 ? 1 : 0;
/** How many keys a family's scripts take: the plain lock 2, the shapes 3 (see `shapeKeys`). */
const keysOf = (family: number): number => (family === 0 ? 2 : 3);

/** KEYS (2; 3 for a semaphore or a read lock; 4 for a fair lock), then ARGV. */
type LockScriptArgs = readonly (string | number)[];

/** Fair-lock release commands by [sharded pub/sub][fence counter deleted], and their scripts. */
const FAIR_RELEASE_COMMANDS = [
  ['redisLockReleaseFair', 'redisLockReleaseFairForgetting'],
  ['redisLockReleaseFairSharded', 'redisLockReleaseFairForgettingSharded'],
] as const;
const FAIR_RELEASE_SCRIPTS = [
  [RELEASE_FAIR_SCRIPT, RELEASE_FAIR_FORGETTING_SCRIPT],
  [RELEASE_FAIR_SHARDED_SCRIPT, RELEASE_FAIR_FORGETTING_SHARDED_SCRIPT],
] as const;
type FairReleaseCommand = (...args: LockScriptArgs) => Promise<number>;

/** The lock scripts (see `lockScripts`: EVALSHA, EVAL if the server does not have it). */
interface LockCommands {
  /** ARGV: token, ttl, the fence counter's TTL (ttl + retention; for a semaphore, then the limit). */
  redisLockAcquire(...args: LockScriptArgs): Promise<number>;
  redisLockAcquireOwnToken(...args: LockScriptArgs): Promise<number>;
  redisLockAcquireSemaphore(...args: LockScriptArgs): Promise<number>;
  redisLockAcquireRead(...args: LockScriptArgs): Promise<number>;
  redisLockExtend(...args: LockScriptArgs): Promise<number>;
  redisLockExtendSemaphore(...args: LockScriptArgs): Promise<number>;
  redisLockExtendRead(...args: LockScriptArgs): Promise<number>;
  redisLockRelease: ReleaseCommand;
  redisLockReleaseForgetting: ReleaseCommand;
  redisLockReleaseSharded: ReleaseCommand;
  redisLockReleaseForgettingSharded: ReleaseCommand;
  redisLockReleaseSemaphore: ReleaseCommand;
  redisLockReleaseSemaphoreForgetting: ReleaseCommand;
  redisLockReleaseSemaphoreSharded: ReleaseCommand;
  redisLockReleaseSemaphoreForgettingSharded: ReleaseCommand;
  redisLockReleaseRead: ReleaseCommand;
  redisLockReleaseReadForgetting: ReleaseCommand;
  redisLockReleaseReadSharded: ReleaseCommand;
  redisLockReleaseReadForgettingSharded: ReleaseCommand;
  redisLockIsHeld(lockKey: string, token: string): Promise<number>;
  redisLockDropMark(lockKey: string): Promise<number>;
  redisLockAcquireFair(...args: LockScriptArgs): Promise<number>;
  /** The number of keys first (it varies), then KEYS and ARGV. */
  redisLockAcquireAll(...args: LockScriptArgs): Promise<number[] | number>;
  redisLockReleaseFair: FairReleaseCommand;
  redisLockReleaseFairForgetting: FairReleaseCommand;
  redisLockReleaseFairSharded: FairReleaseCommand;
  redisLockReleaseFairForgettingSharded: FairReleaseCommand;
  redisLockRaiseFence(
    lockKey: string,
    fenceKey: string,
    token: string,
    fence: number,
    counterTtl: number,
  ): Promise<number>;
  redisLockHandoff: HandoffCommand;
  redisLockHandoffUnreserved: HandoffCommand;
  redisLockPassOn: HandoffCommand;
}

type HandoffCommand = (
  lockKey: string,
  fenceKey: string,
  token: string,
  heirToken: string,
  heirTtl: number,
  counterTtl: number,
) => Promise<number>;

/**
 * Locks on one Redis deployment reached through one ioredis client: a standalone server, a
 * Sentinel-managed master, or a Cluster.
 *
 * Key layout for key `K` with prefix `P`: the lock is `P{K}` (value: owner token), its fence
 * counter `P{K}:fence`, and releases are announced on channel `P{K}:released`. The hash tag
 * keeps all three in one cluster slot; see `lockKey()` for keys that contain `}`.
 */
export class RedisLockBackend implements LockBackend {
  private readonly commands: LockCommands;
  private readonly notifier: ReleaseNotifier;
  private readonly batcher: WriteBatcher | undefined;
  readonly replyTimeout: number;

  private readonly keyPrefix: string;
  /** Longest wait for QUIT when closing a connection. */
  private readonly commandTimeout: number;
  private readonly fenceRetention: number;
  private readonly replicaAck: ReplicaAck | undefined;
  /**
   * Fences per grant from Redis to a generated token (see `FENCE_STRIDE`): the grant's own and
   * those its in-process heirs may take (see `passOn`). One where no release passes a lock on
   * (`replicaAck`), and where every release deletes the counter (`fenceRetention: 0`): the next
   * fence then comes from the server's clock, which need not have moved past a whole block since.
   */
  private readonly stride: number;
  /**
   * How long a waiter's claim lasts without another attempt (a fair waiter's place in the queue, a
   * writer's mark on read locks): it attempts at least every retryInterval (+ jitter, + a reply
   * within commandTimeout), so twice that never drops a live one.
   */
  private readonly queueStay: number;
  private readonly isCluster: boolean;
  /** Cluster: whether releases use sharded pub/sub, once decided (see `shardedPubSub`). */
  private pubSubChoice: Promise<boolean> | undefined;

  constructor(
    private readonly client: Redis | Cluster,
    options: Pick<
      ResolvedModuleOptions,
      'keyPrefix' | 'commandTimeout' | 'fenceRetention' | 'replicaAck'
    > &
      Partial<Pick<ResolvedModuleOptions, 'defaults' | 'handoffTurn'>>,
    /** Whether this backend created the client, and so must close it. */
    private readonly ownsClient: boolean,
    private readonly logger: Logger,
  ) {
    ({
      keyPrefix: this.keyPrefix,
      commandTimeout: this.commandTimeout,
      fenceRetention: this.fenceRetention,
      replicaAck: this.replicaAck,
    } = options);
    this.stride = this.replicaAck || this.fenceRetention === 0 ? 1 : FENCE_STRIDE;
    const { retryInterval = 1_000, retryJitter = 50 } = options.defaults ?? {};
    this.queueStay = 2 * (retryInterval + retryJitter + this.commandTimeout);
    const scripts: Record<string, ScriptDefinition> = {
      redisLockAcquireFair: { numberOfKeys: 4, lua: ACQUIRE_FAIR_SCRIPT },
      redisLockAcquireAll: { lua: ACQUIRE_ALL_SCRIPT },
      redisLockIsHeld: { numberOfKeys: 1, lua: IS_HELD_SCRIPT },
      redisLockDropMark: { numberOfKeys: 1, lua: DROP_MARK_SCRIPT },
      redisLockAcquire: { numberOfKeys: 2, lua: ACQUIRE_SCRIPT },
      redisLockHandoff: { numberOfKeys: 2, lua: HANDOFF_SCRIPT },
      redisLockHandoffUnreserved: { numberOfKeys: 2, lua: HANDOFF_UNRESERVED_SCRIPT },
      redisLockPassOn: { numberOfKeys: 2, lua: PASS_ON_SCRIPT },
      redisLockRaiseFence: { numberOfKeys: 2, lua: RAISE_FENCE_SCRIPT },
    };
    // Per family (see `keysOf`): the plain lock's scripts take 2 keys, the shapes' 3.
    const byFamily = (names: readonly string[], luas: readonly string[], family: number): void =>
      names.forEach((name, i) => (scripts[name] = { numberOfKeys: keysOf(family), lua: luas[i] }));
    [ACQUIRE_OWN_TOKEN_SCRIPT, ACQUIRE_SEMAPHORE_SCRIPT, ACQUIRE_READ_SCRIPT].forEach((lua, i) =>
      byFamily([ACQUIRE_COMMANDS[i]], [lua], i),
    );
    [EXTEND_SCRIPT, EXTEND_SEMAPHORE_SCRIPT, EXTEND_READ_SCRIPT].forEach((lua, i) =>
      byFamily([EXTEND_COMMANDS[i]], [lua], i),
    );
    RELEASE_COMMANDS.forEach((names, i) => byFamily(names.flat(), RELEASE_SCRIPTS[i].flat(), i));
    FAIR_RELEASE_COMMANDS.flat().forEach((name, i) => {
      scripts[name] = { numberOfKeys: 4, lua: FAIR_RELEASE_SCRIPTS.flat()[i] };
    });
    this.commands = lockScripts(client, scripts) as unknown as LockCommands;
    this.batcher = WriteBatcher.for(client);
    this.isCluster = (client as { isCluster?: boolean }).isCluster === true;
    this.notifier = new ReleaseNotifier(
      [client],
      this.commandTimeout,
      logger,
      this.isCluster ? this.shardedPubSub : undefined,
      options.handoffTurn,
    );
    this.replyTimeout = this.commandTimeout;
  }

  /**
   * How long a lock is surely ours, from when its command was sent: its TTL less 1 % and 2 ms, the
   * margin Redlock keeps for clock drift. The lease already starts before Redis's TTL does, but only
   * by the command's trip (~0.05 ms on loopback); the margin covers the holder's expiry timer firing
   * late on a busy event loop, and the two clocks' rates, so a holder cut off from Redis stops
   * before another process can take the key (seen in the chaos suite without it: a partitioned
   * holder's timer fired 1.3 ms after another process had the lock).
   */
  validity(ttl: number): number {
    return ttl - ttl * DEFAULT_DRIFT_FACTOR - 2;
  }

  /** Semaphores and read locks work on one deployment. */
  readonly shapes = true;

  async tryAcquire(
    key: string,
    token: string,
    ttl: number,
    shape: LockShape = PLAIN,
    queue = true,
    reserve = false,
  ): Promise<AcquireAttempt> {
    const lockKey = this.lockKey(key);
    const family = familyOf(shape);
    const fenceKey = `${lockKey}:fence`;
    const counterTtl = this.counterTtl(ttl);
    let args: LockScriptArgs;
    if (shape.fair) {
      const stay = queue ? this.queueStay : 0;
      args = [lockKey, fenceKey, ...this.queueKeys(lockKey), token, ttl, counterTtl, stay];
    } else if (family === 1) {
      args = [...this.shapeKeys(lockKey), token, ttl, counterTtl, shape.limit, reserve ? 0 : 1];
    } else if (family === 2) {
      args = [...this.shapeKeys(lockKey), token, ttl, counterTtl, reserve ? 0 : 1];
    } else if (queue) {
      // A writer that will wait holds new readers off (see MARK_WRITER), for as long as its place
      // in a fair queue would last.
      args = [lockKey, fenceKey, token, ttl, counterTtl, this.queueStay];
    } else {
      args = [lockKey, fenceKey, token, ttl, counterTtl];
    }
    const reserving = reserve && family === 0 && !shape.fair && this.stride > 1;
    const command = shape.fair
      ? 'redisLockAcquireFair'
      : reserving
        ? 'redisLockAcquire'
        : ACQUIRE_COMMANDS[family];
    this.batcher?.beforeSend();
    let reply: number;
    if (this.replicaAck) {
      let acknowledged: number;
      [reply, acknowledged] = await this.replicated(command, args);
      if (reply > 0 && acknowledged < this.replicaAck.replicas) {
        await this.release(key, token, shape).catch(() => false); // else it expires after its TTL
        throw this.unreplicated(key, 'acquire', acknowledged);
      }
    } else {
      reply = await this.commands[command](...args);
    }
    if (reply > 0) {
      const fenceLimit = reserving ? reply + this.stride - 1 : reply;
      return { acquired: true, fence: reply, fenceLimit, validity: this.validity(ttl) };
    }
    return { acquired: false, retryAfter: reply <= -2 ? -2 - reply : undefined };
  }

  async extend(
    key: string,
    token: string,
    ttl: number,
    shape: LockShape = PLAIN,
  ): Promise<boolean> {
    const lockKey = this.lockKey(key);
    const family = familyOf(shape);
    const keys = family === 0 ? [lockKey, `${lockKey}:fence`] : this.shapeKeys(lockKey);
    const args: LockScriptArgs = [...keys, token, ttl, this.counterTtl(ttl)];
    const command = EXTEND_COMMANDS[family];
    this.batcher?.beforeSend();
    if (!this.replicaAck) return (await this.commands[command](...args)) === 1;
    const [extended, acknowledged] = await this.replicated(command, args);
    if (extended === 1 && acknowledged < this.replicaAck.replicas) {
      throw this.unreplicated(key, 'extend', acknowledged);
    }
    return extended === 1;
  }

  /**
   * With `replicaAck`: runs a lock script and `WAIT` right behind it on the same connection (a
   * pipeline: on Cluster, on the node that owns the key). Resolves the script's reply and how many
   * replicas acknowledged it.
   */
  private async replicated(
    command:
      | (typeof ACQUIRE_COMMANDS)[number]
      | (typeof EXTEND_COMMANDS)[number]
      | 'redisLockAcquire'
      | 'redisLockAcquireFair',
    args: LockScriptArgs,
    redirects = 0,
  ): Promise<[reply: number, acknowledged: number]> {
    const { replicas, timeout } = this.replicaAck!;
    const pipeline = this.client.pipeline();
    (pipeline as unknown as Record<typeof command, (...args: unknown[]) => unknown>)[command](
      ...args,
    );
    const [[scriptError, reply], [waitError, acknowledged]] = (await pipeline
      .wait(replicas, timeout)
      .exec())!;
    // ioredis follows a MOVED in a cluster pipeline only when every command in it got one, and
    // WAIT (no key) does not. A READONLY comes from a master demoted a moment ago. Either way the
    // slot has a new owner: refresh the slot map (a pipeline is routed by it) and send the pair
    // again, a few times, pausing a little longer each time while the nodes' views converge.
    const message = this.isCluster ? (scriptError?.message ?? '') : '';
    if (/^(MOVED|READONLY) /.test(message) && redirects < MAX_REDIRECTS) {
      await new Promise<void>((resolve) =>
        (this.client as Cluster).refreshSlotsCache(() => resolve()),
      );
      if (redirects > 0) await new Promise((resolve) => setTimeout(resolve, 20 * redirects));
      return this.replicated(command, args, redirects + 1);
    }
    if (scriptError) throw scriptError;
    if (waitError) throw waitError;
    return [reply as number, acknowledged as number];
  }

  private unreplicated(
    key: string,
    operation: 'acquire' | 'extend',
    acknowledged: number,
  ): LockReplicationError {
    const { replicas, timeout } = this.replicaAck!;
    return new LockReplicationError(key, operation, replicas, acknowledged, timeout);
  }

  /** See `LockBackend.release`; `message` is what the release announces (see `RELEASE_SCRIPT`). */
  async release(
    key: string,
    token: string,
    shape: LockShape = PLAIN,
    lease?: HeldLease,
    message = '',
  ): Promise<boolean> {
    const lockKey = this.lockKey(key);
    const channel = `${lockKey}:released`;
    // No handoffs with replicaAck (the heir's lock would be granted without WAIT), nor of a
    // semaphore's place or a read lock (the next holder may be any caller; the release wakes one).
    const heir =
      this.notifier.watching && !this.replicaAck && shape === PLAIN
        ? this.notifier.takeHeir(channel)
        : undefined;
    if (heir && lease && passable(lease, heir.claim.ttl)) {
      return this.passOn(key, lockKey, token, heir, lease);
    }
    // Only once this lease's own token write is answered: Redis must see the two in order.
    if (lease?.swap) await lease.swap.catch(() => undefined);
    if (shape.fair) return (await this.fairRelease(lockKey, token, true, message)) > 0;
    this.batcher?.beforeSend();
    if (heir) return this.handOff(key, lockKey, token, heir);
    let reply = 0;
    try {
      const sharded = this.isCluster && (await this.shardedPubSub());
      const family = familyOf(shape);
      const command = RELEASE_COMMANDS[family][sharded ? 1 : 0][this.fenceRetention === 0 ? 1 : 0];
      const keys = family === 0 ? [lockKey, `${lockKey}:fence`] : this.shapeKeys(lockKey);
      reply = await this.commands[command](...keys, token, channel, message);
    } finally {
      // Yielding (see takeHeir): another subscriber than this process's own got the message.
      if (this.notifier.watching) this.notifier.endYield(channel, reply > 2);
    }
    return reply > 0;
  }

  /**
   * Redlock: releases the copy a failed attempt got on this node, sending the script itself
   * (`EVAL`), never `EVALSHA`. On a node that lost its scripts (restarted empty), `EVALSHA` is
   * answered `NOSCRIPT` and the script re-sent behind whatever was written meanwhile: the next
   * attempt with the same token would then re-take the copy first and lose it to this late
   * release, leaving the lock on fewer nodes than its holder counts. The plain lock only (Redlock
   * offers no other shape) and never with `fenceRetention: 0` (refused with `nodes`).
   */
  async undoCopy(key: string, token: string): Promise<boolean> {
    const lockKey = this.lockKey(key);
    const args = [lockKey, `${lockKey}:fence`, token, `${lockKey}:released`, ''];
    return Number(await this.client.eval(RELEASE_SCRIPT, 2, ...args)) > 0;
  }

  /**
   * Releases the lock straight to `heir`, the first waiter of this process: one command instead of
   * a release, a message and the waiter's attempt. If the lock was no longer ours, or Redis did not
   * answer, the heir goes back to trying by itself; if the heir gave up meanwhile without the
   * lock, the lock it was handed is released for it.
   */
  private async handOff(key: string, lockKey: string, token: string, heir: Heir): Promise<boolean> {
    const { token: heirToken, ttl } = heir.claim;
    const sentAt = performance.now();
    let fence: number;
    try {
      const command = this.stride > 1 ? 'redisLockHandoff' : 'redisLockHandoffUnreserved';
      fence = await this.commands[command](
        lockKey,
        `${lockKey}:fence`,
        token,
        heirToken,
        ttl,
        this.counterTtl(ttl),
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
    heir.grant({ fence, fenceLimit, validity: this.validity(ttl), sentAt }, () => {
      this.release(key, heirToken).catch(() => {
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
  private passOn(
    key: string,
    lockKey: string,
    token: string,
    heir: Heir,
    lease: HeldLease,
  ): Promise<boolean> {
    const { token: heirToken, ttl } = heir.claim;
    const counterTtl = this.counterTtl(ttl);
    const send = (): PendingSwap => {
      const sentAt = performance.now();
      this.batcher?.beforeSend();
      return this.commands
        .redisLockPassOn(lockKey, `${lockKey}:fence`, token, heirToken, ttl, counterTtl)
        .then((swapped) => (swapped === 1 ? sentAt : undefined));
    };
    // Sent once the heir has run up to its first wait (see `afterReactions`), unless it goes
    // behind our own write, still in flight.
    const swap = lease.swap
      ? lease.swap.then((sent) => (sent === undefined ? undefined : send()))
      : afterReactions().then(send);
    const now = performance.now();
    const { fence, fenceLimit, expiresAt } = lease;
    // What is left of our lease, but never more than the heir's own: once its write lands, Redis
    // lets the key go after the heir's TTL, however late the reply that would correct the lease.
    const validity = Math.min(expiresAt - now, this.validity(ttl));
    heir.grant({ fence: fence + 1, fenceLimit, validity, sentAt: now, swap }, () => {
      swap
        .then((sent) => sent !== undefined && this.release(key, heirToken))
        .catch(() => {
          // It expires after its TTL.
        });
    });
    return swap.then((sent) => sent !== undefined);
  }

  /**
   * Redlock mode: raises this node's fence counter of `key` to at least `fence` if `token` holds
   * the lock here (see `RAISE_FENCE_SCRIPT`). Resolves whether it does.
   */
  async raiseFence(key: string, token: string, fence: number, ttl: number): Promise<boolean> {
    const lockKey = this.lockKey(key);
    this.batcher?.beforeSend();
    const raised = await this.commands.redisLockRaiseFence(
      lockKey,
      `${lockKey}:fence`,
      token,
      fence,
      this.counterTtl(ttl),
    );
    return raised === 1;
  }

  /**
   * How long a key's fence counter lives after a holder's write: its lock's TTL + the fence
   * retention. The scripts get it summed (see FENCE_OF).
   */
  private counterTtl(ttl: number): number {
    return ttl + this.fenceRetention;
  }

  async prepare(): Promise<void> {
    if (!this.isCluster) return;
    await this.shardedPubSub().catch((error: unknown) => {
      this.logger.warn(
        `Cluster: could not ask the servers how to announce releases at startup (${describeFailure(error, this.commandTimeout)}); deciding at the first lock release or wait.`,
      );
    });
  }

  /**
   * The server's `run_id` (new at every start of redis-server), asked within `commandTimeout`:
   * what tells one server apart from another whatever name it was reached by. `undefined` if it
   * does not answer in time.
   */
  async serverId(): Promise<string | undefined> {
    const info = await within(this.client.info('server'), this.commandTimeout, []).catch(() => '');
    return /^run_id:(\w+)/m.exec(info)?.[1];
  }

  async health(): Promise<BackendHealth> {
    const started = performance.now();
    try {
      await within(this.client.ping(), this.commandTimeout, []);
      return { up: true, details: { latencyMs: round(performance.now() - started) } };
    } catch (error) {
      return { up: false, details: { error: describeFailure(error, this.commandTimeout) } };
    }
  }

  async isLocked(key: string): Promise<boolean> {
    return (await this.client.exists(this.lockKey(key))) === 1;
  }

  tryAcquireAll(
    keys: readonly string[],
    token: string,
    ttl: number,
  ): Promise<number[] | { retryAfter: number | undefined }> | undefined {
    if (this.isCluster || this.replicaAck) return undefined;
    const names = keys.flatMap((key) => {
      const lockKey = this.lockKey(key);
      return [lockKey, `${lockKey}:fence`];
    });
    this.batcher?.beforeSend();
    return this.commands
      .redisLockAcquireAll(names.length, ...names, token, ttl, this.counterTtl(ttl))
      .then((reply) =>
        Array.isArray(reply) ? reply : { retryAfter: reply <= -2 ? -2 - reply : undefined },
      );
  }

  async giveUp(key: string, token: string, shape: LockShape): Promise<void> {
    if (shape.fair) {
      await this.fairRelease(this.lockKey(key), token, false, '');
    } else if (shape === PLAIN) {
      this.batcher?.beforeSend();
      await this.commands.redisLockDropMark(this.lockKey(key));
    }
  }

  /** A fair lock's release (`releasing`) or a waiter leaving its queue: see `fairRelease` script. */
  private async fairRelease(
    lockKey: string,
    token: string,
    releasing: boolean,
    message: string,
  ): Promise<number> {
    const sharded = this.isCluster && (await this.shardedPubSub());
    const command = FAIR_RELEASE_COMMANDS[sharded ? 1 : 0][this.fenceRetention === 0 ? 1 : 0];
    this.batcher?.beforeSend();
    return this.commands[command](
      lockKey,
      `${lockKey}:fence`,
      ...this.queueKeys(lockKey),
      token,
      message,
      releasing ? 1 : 0,
      `${lockKey}:fair:`,
    );
  }

  /**
   * A semaphore's or read lock's keys: its holders, the fence counter, and the fences its callers'
   * own tokens hold (see `SHARED_FENCE`), in the key's slot.
   */
  private shapeKeys(lockKey: string): [string, string, string] {
    return [lockKey, `${lockKey}:fence`, `${lockKey}:fences`];
  }

  /** A fair lock's queue and its waiters' stay (see `ACQUIRE_FAIR_SCRIPT`), in the key's slot. */
  private queueKeys(lockKey: string): [string, string] {
    return [`${lockKey}:queue`, `${lockKey}:queue:stay`];
  }

  async isHeld(key: string, token: string): Promise<boolean> {
    return (await this.commands.redisLockIsHeld(this.lockKey(key), token)) === 1;
  }

  onReconnect(listener: () => void): () => void {
    let dropped = false;
    const onClose = (): void => void (dropped = true);
    const onReady = (): void => {
      if (!dropped) return;
      dropped = false;
      listener();
    };
    // Listening changes nothing on a client the app passed in; the listeners go with close().
    this.client.on('close', onClose).on('ready', onReady);
    return () => void this.client.off('close', onClose).off('ready', onReady);
  }

  hasWaiters(key: string): boolean {
    return this.notifier.watching && this.notifier.isWatched(this.releaseChannel(key));
  }

  watchReleases(key: string, claim?: HandoffClaim, turnOf?: string): ReleaseSubscription {
    const channel =
      turnOf === undefined ? this.releaseChannel(key) : `${this.lockKey(key)}:fair:${turnOf}`;
    return this.notifier.watch(channel, claim);
  }

  /**
   * Cluster: whether releases are announced with SPUBLISH on the node that owns the key's slot
   * (Redis >= 7 and an ioredis that routes SSUBSCRIBE, >= 5.6) rather than with PUBLISH, which the
   * cluster bus copies to every node. Decided when the app starts (`prepare`) or, if the cluster
   * could not be reached then, on first need; logged, and kept.
   */
  private readonly shardedPubSub = (): Promise<boolean> =>
    (this.pubSubChoice ??= this.choosePubSub().catch((error: unknown) => {
      this.pubSubChoice = undefined;
      throw error;
    }));

  private async choosePubSub(): Promise<boolean> {
    const info = await within(this.client.info('server'), this.commandTimeout, []);
    const version = /redis_version:(\S+)/.exec(info)?.[1] ?? 'unknown';
    const probe = (this.client as Cluster).duplicate(undefined, {
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

  /** The channel on which releases of `key` are announced. */
  releaseChannel(key: string): string {
    return `${this.lockKey(key)}:released`;
  }

  async close(): Promise<void> {
    await Promise.all([
      this.notifier.close(),
      this.ownsClient ? closeQuietly(this.client, this.commandTimeout) : undefined,
    ]);
  }

  /**
   * `P{K}`. A `}` inside `K` would end the hash tag early (and one at its start would empty it,
   * hashing the whole name, so the lock and its fence counter could land in different slots), so
   * `}` is written `%7D` and, to keep the mapping one-to-one, `%` is written `%25`.
   */
  private lockKey(key: string): string {
    return `${this.keyPrefix}{${ESCAPED.test(key) ? key.replace(ESCAPED_ALL, escapeChar) : key}}`;
  }
}

/** What went wrong with a Redis call, for a health report or a log line. */
export function describeFailure(error: unknown, commandTimeout: number): string {
  if (error === DEADLINE) return `no reply within commandTimeout (${commandTimeout} ms)`;
  return error instanceof Error ? error.message : String(error);
}

const round = (ms: number): number => Math.round(ms * 100) / 100;

/** Most redirections (MOVED, READONLY) one `replicaAck` write follows (ioredis' own default is 16). */
const MAX_REDIRECTS = 5;

const ESCAPED = /[%}]/;
const ESCAPED_ALL = /[%}]/g;
const escapeChar = (char: string): string => (char === '%' ? '%25' : '%7D');

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

/**
 * Creates a client the module owns for a `connection` (or a Redlock node given as a URL or
 * options), with `OWN_CONNECTION_DEFAULTS` under the caller's options and no socket opened yet.
 */
export function createClient(connection: string | RedisOptions, logger: Logger): Redis {
  const client =
    typeof connection === 'string'
      ? new Redis(connection, { ...OWN_CONNECTION_DEFAULTS, lazyConnect: true })
      : new Redis({
          ...OWN_CONNECTION_DEFAULTS,
          ...(connection.sentinels ? SENTINEL_DEFAULTS : {}),
          ...connection,
          lazyConnect: true,
        });
  watchConnection(client, 'Redis connection', logger);
  return client;
}

/**
 * What the module sets on connections it creates (a `client` you pass is never reconfigured;
 * `commandTimeout` bounds every call on it all the same). Your `connection` options override these.
 * - `maxRetriesPerRequest: 0`: a command sent while Redis is unreachable fails at the next failed
 *   reconnection attempt instead of queueing through 20 of them, so a down Redis is reported at
 *   once and a stale lock command is not sent long after its caller gave up.
 * - `autoResendUnfulfilledCommands: false`: a lock command whose reply was lost with the connection
 *   is not sent again after reconnecting; its caller was already told `LockBackendError`.
 * - `reconnectOnError`: reconnect after a `READONLY` error (see `reconnectOnReadOnly`).
 * - The offline queue stays on (the first command must wait for the lazy connection) and the
 *   reconnection strategy is ioredis' own (retry forever, backing off to 2 s): when Redis comes
 *   back, locking resumes by itself.
 * `lazyConnect: true` is added over your options: no socket is opened before the first lock
 * command, so an app whose bootstrap fails later never leaks a connection it cannot close.
 */
const OWN_CONNECTION_DEFAULTS = {
  maxRetriesPerRequest: 0,
  autoResendUnfulfilledCommands: false,
  reconnectOnError: reconnectOnReadOnly,
} as const satisfies RedisOptions;

/**
 * Also set on connections the module creates through Sentinel (`connection: { sentinels, name }`):
 * - `failoverDetector: true`: ioredis listens to the Sentinels' `+switch-master` and reconnects to
 *   the new master at once. Without it, a connection to a demoted master keeps going there
 *   (measured: locks were taken again ~11 s after `SENTINEL FAILOVER`; with it, ~0.2 s after
 *   Sentinel switched).
 * - `retryStrategy`: reconnect every 50, 100, ... up to 250 ms (ioredis' own backs off to 2 s). When
 *   the master died, each try asks the Sentinels where the master is, so locking resumes within a
 *   quarter second of Sentinel's switch instead of up to two.
 */
const SENTINEL_DEFAULTS = {
  failoverDetector: true,
  retryStrategy: (times: number) => Math.min(times * 50, 250),
} as const satisfies RedisOptions;

/**
 * `reconnectOnError` of connections the module creates: a `READONLY` reply means the server is a
 * replica now (a failover demoted it, or a DNS name moved): reconnect, which through Sentinel asks
 * for the current master. The failed command is not sent again (its caller got `LockBackendError`).
 */
function reconnectOnReadOnly(error: Error): boolean {
  return error.message.includes('READONLY');
}
