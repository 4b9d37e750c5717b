import type { Logger } from '@nestjs/common';
import type { Cluster, Redis } from 'ioredis';
import type { ReplicaAck } from '../interfaces/redis-lock-options.interface.js';
import type { ResolvedModuleOptions } from '../options/module-options.js';
import type {
  AcquireAttempt,
  Election,
  HeldLease,
  Inspection,
  Freed,
  LockBackend,
  LockShape,
} from '../interfaces/lock-backend.interface.js';
import { DEFAULT_DRIFT_FACTOR } from '../options/defaults.js';
import { PLAIN } from '../options/checks.js';
import {
  ANNOUNCE_REFUSED,
  FENCE_STRIDE,
  RAISE_FENCE_SCRIPT,
  RELEASE_SCRIPT,
  UNDO_QUIETLY_SCRIPT,
  UNDO_OWN_SCRIPT,
  RESTORE_COPY_SCRIPT,
} from './lock.scripts.js';
import { FairQueue } from './fair-queue.js';
import { holding, InProcessHandoff, passable } from './handoff.js';
import {
  acquireArgs,
  acquireCommand,
  defineLockCommands,
  EXTEND_COMMANDS,
  familyOf,
  plainKeys,
  RELEASE_COMMANDS,
  releaseKeys,
  type LockCommands,
  type LockScriptArgs,
} from './lock-commands.js';
import { RedisDeployment } from './redis-deployment.js';
import { replicated, unreplicated } from './replica-ack.js';
import { WriteBatcher } from './write-batcher.js';

/**
 * Locks on one Redis deployment reached through one ioredis client: a standalone server, a
 * Sentinel-managed master, or a Cluster. The operations (acquire, extend, release, fence) are
 * here; the deployment itself (key layout, release notifications, startup, health, close) is
 * `RedisDeployment`, the scripts `lock-commands`, releases to a waiter of this process
 * `InProcessHandoff`, fair locks' queue `FairQueue`, and the connection defaults `connections`.
 */
export class RedisLockBackend extends RedisDeployment implements LockBackend {
  private readonly commands: LockCommands;
  private readonly batcher: WriteBatcher | undefined;

  private readonly handoff: InProcessHandoff;
  private readonly fair: FairQueue;
  private readonly fenceRetention: number;
  private readonly replicaAck: ReplicaAck | undefined;
  /**
   * Fences per grant from Redis to a generated token (see `FENCE_STRIDE`): the grant's own and
   * those its in-process heirs may take (see `passOn`). One where no release passes a lock on
   * (`replicaAck`), and where the counter does not outlive the locks (`fenceRetention: 0`): the
   * next fence may then come from the server's clock, which need not have moved past a whole block
   * since.
   */
  private readonly stride: number;
  /**
   * How long a waiter's claim lasts without another attempt (a fair waiter's place in the queue, a
   * writer's mark on read locks): it attempts at least every retryInterval (+ jitter, + a reply
   * within commandTimeout), so twice that never drops a live one.
   */
  private readonly queueStay: number;
  /** Whether Redis refused to announce a release once: said once (see `released`). */
  private announceRefused = false;

  constructor(
    client: Redis | Cluster,
    options: Pick<
      ResolvedModuleOptions,
      'keyPrefix' | 'commandTimeout' | 'fenceRetention' | 'replicaAck'
    > &
      Partial<Pick<ResolvedModuleOptions, 'defaults' | 'handoffTurn'>>,
    /** Whether this backend created the client, and so must close it. */
    ownsClient: boolean,
    logger: Logger,
    /**
     * One node of a Redlock deployment (see `RedlockBackend`): no lock is passed on in the process
     * there (so no block of fences is reserved), no process joins a key's queue of waiting
     * processes, and a caller's own token is granted with its record's tag (see
     * `ACQUIRE_OWN_TOKEN_REDLOCK_SCRIPT`).
     */
    private readonly redlockNode = false,
  ) {
    super(client, options, ownsClient, logger);
    ({ fenceRetention: this.fenceRetention, replicaAck: this.replicaAck } = options);
    this.stride = this.replicaAck || this.fenceRetention === 0 || redlockNode ? 1 : FENCE_STRIDE;
    const { retryInterval = 1_000, retryJitter = 50 } = options.defaults ?? {};
    this.queueStay = 2 * (retryInterval + retryJitter + this.commandTimeout);
    this.commands = defineLockCommands(client);
    this.batcher = WriteBatcher.for(client);
    this.handoff = new InProcessHandoff(this.commands, this.batcher, this.stride, this);
    this.fair = new FairQueue(this.commands, this.batcher, this.layout, this.shardedPubSub);
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

  /** `floor`: a Redlock node's attempt for a generated token (see `ACQUIRE_REDLOCK_SCRIPT`). */
  async tryAcquire(
    key: string,
    token: string,
    ttl: number,
    shape: LockShape = PLAIN,
    queue = true,
    reserve = false,
    floor?: number,
  ): Promise<AcquireAttempt> {
    const lockKey = this.layout.lockKey(key);
    // (A Redlock floor is ARGV[5]: ARGV[4] is always sent then.)
    const queueStay = queue || floor !== undefined ? this.queueStay : 0;
    const counterTtl = this.counterTtl(ttl);
    // A generated token's plain lock that will wait joins the key's queue of waiting processes.
    const waiting = reserve && shape === PLAIN && !this.redlockNode ? this.processId : undefined;
    const args = acquireArgs(
      this.layout,
      lockKey,
      shape,
      token,
      ttl,
      counterTtl,
      queueStay,
      reserve,
      waiting,
    );
    const reserving = reserve && familyOf(shape) === 0 && !shape.fair && this.stride > 1;
    const command = acquireCommand(shape, reserve, reserving);
    this.batcher?.beforeSend();
    let reply: number | [number, number] | [number, string];
    if (this.replicaAck) {
      let acknowledged: number;
      [reply, acknowledged] = await replicated(this.client, this.replicaAck, command, args);
      if (reply > 0 && acknowledged < this.replicaAck.replicas) {
        await this.release(key, token, shape).catch(() => false); // else it expires after its TTL
        throw unreplicated(key, 'acquire', acknowledged, this.replicaAck);
      }
    } else if (this.redlockNode && !reserve) {
      reply = await this.commands.redisLockAcquireOwnTokenRedlock(...args);
    } else if (floor !== undefined) {
      reply = await this.commands.redisLockAcquireRedlock(...args, floor);
    } else {
      reply = await this.commands[command](...args);
    }
    if (Array.isArray(reply) && reply[0] < 0) {
      // Redlock mode: refused, naming the token that holds the key here.
      const [code, holder] = reply;
      return {
        acquired: false,
        retryAfter: code <= -2 ? -2 - code : undefined,
        held: true,
        holder: String(holder),
      };
    }
    if (Array.isArray(reply)) {
      const [fence, renewed] = reply as [number, number];
      const validity = this.validity(ttl);
      return { acquired: true, fence, validity, renewed: renewed > 0, settled: renewed === 2 };
    }
    if (reply > 0) {
      const fenceLimit = reserving ? reply + this.stride - 1 : reply;
      return { acquired: true, fence: reply, fenceLimit, validity: this.validity(ttl) };
    }
    return { acquired: false, retryAfter: reply <= -2 ? -2 - reply : undefined, held: reply < 0 };
  }

  async extend(
    key: string,
    token: string,
    ttl: number,
    shape: LockShape = PLAIN,
  ): Promise<boolean> {
    const lockKey = this.layout.lockKey(key);
    const family = familyOf(shape);
    const keys = family === 0 ? plainKeys(this.layout, lockKey) : this.layout.shapeKeys(lockKey);
    const args: LockScriptArgs = [...keys, token, ttl, this.counterTtl(ttl)];
    const command = EXTEND_COMMANDS[family];
    this.batcher?.beforeSend();
    if (!this.replicaAck) return (await this.commands[command](...args)) === 1;
    const [extended, acknowledged] = await replicated(this.client, this.replicaAck, command, args);
    if (extended === 1 && acknowledged < this.replicaAck.replicas) {
      throw unreplicated(key, 'extend', acknowledged, this.replicaAck);
    }
    return extended === 1;
  }

  /**
   * See `LockBackend.release`; `message` is what the release announces (see `RELEASE_SCRIPT`).
   * Followed until answered, so that closing waits for it (see `close`).
   */
  release(
    key: string,
    token: string,
    shape: LockShape = PLAIN,
    lease?: HeldLease,
    keep = 0,
    message = '',
  ): Promise<boolean> {
    return this.writes.track(
      keep > 0
        ? this.keepFor(key, token, shape, lease, keep)
        : this.releaseNow(key, token, shape, lease, message),
      key,
    );
  }

  /** A release that keeps the key `keep` ms more (`holdAtLeast`: see `LockBackend.release`). */
  private async keepFor(
    key: string,
    token: string,
    shape: LockShape,
    lease: HeldLease | undefined,
    keep: number,
  ): Promise<boolean> {
    // Only once this lease's own token write is answered: Redis must see the two in order.
    if (lease?.swap) await lease.swap.catch(() => undefined);
    const kept = await this.extend(key, token, keep, shape);
    const lockKey = this.layout.lockKey(key);
    if (shape === PLAIN && !this.takesTurns(key)) {
      this.batcher?.beforeSend();
      await this.commands.redisLockDropMark(lockKey, this.layout.turnsKey(lockKey), this.processId);
    }
    return kept;
  }

  private async releaseNow(
    key: string,
    token: string,
    shape: LockShape,
    lease: HeldLease | undefined,
    message: string,
  ): Promise<boolean> {
    const lockKey = this.layout.lockKey(key);
    const channel = this.layout.releaseChannel(lockKey);
    // No handoffs with replicaAck (the heir's lock would be granted without WAIT), nor of a
    // semaphore's place or a read lock (the next holder may be any caller; the release wakes one).
    const heir =
      this.notifier.watching && !this.replicaAck && shape === PLAIN
        ? this.notifier.takeHeir(channel, holding(lease, this.commandTimeout))
        : undefined;
    if (heir && lease && passable(lease, heir.claim.ttl, this.connectionLostAt)) {
      return this.handoff.passOn(key, lockKey, token, heir, lease);
    }
    // Only once this lease's own token write is answered: Redis must see the two in order.
    if (lease?.swap) await lease.swap.catch(() => undefined);
    if (shape.fair) return this.released(await this.fair.release(lockKey, token, true, message));
    this.batcher?.beforeSend();
    if (heir) return this.handoff.handOff(key, lockKey, token, heir);
    let reply = 0;
    try {
      const sharded = this.shardedPubSub !== undefined && (await this.shardedPubSub());
      const family = familyOf(shape);
      const command = RELEASE_COMMANDS[family][sharded ? 1 : 0];
      if (family === 0) {
        // Names the next process to try; this one goes to the back of the queue if callers of it
        // that take turns still wait (see NAME_NEXT), else it leaves it: a reader of it waiting
        // never joins the queue, and would not take it out again.
        const keys = releaseKeys(this.layout, lockKey);
        const turn = this.notifier.takesTurns(channel)
          ? [this.processId, this.queueStay]
          : [this.processId];
        reply = await this.commands[command](...keys, token, channel, message, ...turn);
      } else {
        reply = await this.commands[command](
          ...this.layout.shapeKeys(lockKey),
          token,
          channel,
          message,
        );
      }
    } finally {
      // Yielding (see takeHeir): another subscriber than this process's own got the message.
      if (this.notifier.watching) this.notifier.endYield(channel, reply > 2);
    }
    return this.released(reply);
  }

  /** Whether a release script's `reply` says it released (see `ANNOUNCE`). */
  private released(reply: number): boolean {
    if (reply === ANNOUNCE_REFUSED && !this.announceRefused) {
      this.announceRefused = true;
      this.logger.warn(
        'Redis refused to announce a lock release (PUBLISH: the Redis user may not use the channel): the locks still work, but waiters in other processes now find a free key at their next timed attempt (every retryInterval) instead of at once. Grant the user the channels of keyPrefix (&<keyPrefix>*): see the ACL recipe in the README.',
      );
    }
    return reply !== 0;
  }

  /**
   * Redlock: releases the copy a failed attempt got on this node, sending the script itself
   * (`EVAL`), never `EVALSHA`. On a node that lost its scripts (restarted empty), `EVALSHA` is
   * answered `NOSCRIPT` and the script re-sent behind whatever was written meanwhile: the next
   * attempt with the same token would then re-take the copy first and lose it to this late
   * release, leaving the lock on fewer nodes than its holder counts. The plain lock only (Redlock
   * offers no other shape) and never with `fenceRetention: 0` (refused with `nodes`). Announced
   * with `message`, or, without one, not at all (see `UNDO_QUIETLY_SCRIPT`). With a caller's own
   * token, the `fence` this attempt's grant wrote down here: only while its record is still
   * there (see `UNDO_OWN_SCRIPT`).
   */
  async undoCopy(
    key: string,
    token: string,
    message: string | undefined,
    fence?: number,
  ): Promise<boolean> {
    const lockKey = this.layout.lockKey(key);
    const keys = [lockKey, this.layout.ownFenceKey(lockKey)];
    const announce = message === undefined ? [] : [this.layout.releaseChannel(lockKey), message];
    const reply =
      fence !== undefined
        ? this.client.eval(UNDO_OWN_SCRIPT, 2, ...keys, token, `~${fence}`, ...announce)
        : message === undefined
          ? this.client.eval(UNDO_QUIETLY_SCRIPT, 2, ...keys, token)
          : this.client.eval(
              RELEASE_SCRIPT,
              2,
              ...keys,
              token,
              this.layout.releaseChannel(lockKey),
              message,
            );
    return this.released(Number(await this.writes.track(reply)));
  }

  /**
   * Redlock mode: writes `token`'s copy of the lock on this node for `ttl` if the key is free here
   * (the node restarted empty while a majority kept the lock; see `RedlockBackend.extend`), with
   * its `fence` recorded (see `RESTORE_COPY_SCRIPT`). Sent with `EVAL`, never `EVALSHA`: a node
   * that lost its scripts would answer `NOSCRIPT` and get the script re-sent later, behind whatever
   * happened meanwhile.
   */
  async restoreCopy(key: string, token: string, ttl: number, fence: number): Promise<boolean> {
    const lockKey = this.layout.lockKey(key);
    const args = [lockKey, this.layout.ownFenceKey(lockKey), token, ttl, fence];
    return Number(await this.writes.track(this.client.eval(RESTORE_COPY_SCRIPT, 2, ...args))) === 1;
  }

  /**
   * Redlock mode: raises this node's fence counter of `key` to at least `fence` if `token` holds
   * the lock here, and for a caller's `own` token records that fence (see `RAISE_FENCE_SCRIPT`).
   * Resolves whether it does. `inOrder`: sent with `EVAL`, never `EVALSHA`, so that it runs before
   * whatever is sent to this node after it (a node that lost its scripts would answer `NOSCRIPT`
   * and get the script re-sent behind those commands).
   */
  async raiseFence(
    key: string,
    token: string,
    fence: number,
    ttl: number,
    own: boolean,
    inOrder = false,
  ): Promise<boolean> {
    const args = [
      ...plainKeys(this.layout, this.layout.lockKey(key)),
      token,
      fence,
      this.counterTtl(ttl),
      own ? 1 : 0,
    ] as const;
    this.batcher?.beforeSend();
    const raised = inOrder
      ? await this.client.eval(RAISE_FENCE_SCRIPT, 3, ...args)
      : await this.commands.redisLockRaiseFence(...args);
    return Number(raised) === 1;
  }

  /**
   * How long the fence counter lives at least after a holder's write: its lock's TTL + the fence
   * retention. The scripts get it summed (see FENCE_OF).
   */
  counterTtl(ttl: number): number {
    return ttl + this.fenceRetention;
  }

  /** See `KeyLayout.counterKey`. */
  counterKey(lockKey: string): string {
    return this.layout.counterKey(lockKey);
  }

  tryAcquireAll(
    keys: readonly string[],
    token: string,
    ttl: number,
  ): Promise<number[] | { retryAfter: number | undefined }> | undefined {
    if (this.isCluster || this.replicaAck) return undefined;
    const names = keys.flatMap((key) => {
      const lockKey = this.layout.lockKey(key);
      return [lockKey, this.layout.counterKey(lockKey)];
    });
    this.batcher?.beforeSend();
    return this.commands
      .redisLockAcquireAll(names.length, ...names, token, ttl, this.counterTtl(ttl))
      .then((reply) =>
        Array.isArray(reply) ? reply : { retryAfter: reply <= -2 ? -2 - reply : undefined },
      );
  }

  giveUp(key: string, token: string, shape: LockShape): Promise<void> {
    return this.writes.track(this.leave(key, token, shape));
  }

  /** See `giveUp`. */
  private async leave(key: string, token: string, shape: LockShape): Promise<void> {
    if (shape.fair) {
      await this.fair.release(this.layout.lockKey(key), token, false, '');
    } else if (shape === PLAIN) {
      // A release of the key from this process still on its way (a holder's, sent while this
      // caller still waited: it puts the process at the back of the queue) goes first. After
      // NOSCRIPT it is sent again, behind what was sent meanwhile, and would put the process
      // back after this give-up took it out: queued, and named next, with nobody waiting.
      await this.writes.of(key);
      this.batcher?.beforeSend();
      const lockKey = this.layout.lockKey(key);
      // The last caller of this process that takes turns (see NAME_NEXT) to give up takes it out
      // of the queue of waiting processes: a reader, a semaphore's or a fair caller waiting still
      // never takes turns, and would not take it out again.
      const leaving = this.takesTurns(key) ? [] : [this.processId];
      await this.commands.redisLockDropMark(lockKey, this.layout.turnsKey(lockKey), ...leaving);
    }
  }

  async isHeld(key: string, token: string): Promise<boolean> {
    return (await this.commands.redisLockIsHeld(this.layout.lockKey(key), token)) === 1;
  }

  /** See `LockBackend.recordTerm`; `leastTransitions`: see `RECORD_TERM_SCRIPT`. */
  async recordTerm(
    key: string,
    token: string,
    id: string,
    fence: number,
    ttl: number,
    leastTransitions = 0,
  ): Promise<void> {
    const lockKey = this.layout.lockKey(key);
    const [record] = this.layout.electionKeys(lockKey);
    await this.commands.redisLockRecordTerm(
      lockKey,
      record,
      token,
      id,
      fence,
      ttl,
      ELECTION_KEPT,
      leastTransitions,
    );
  }

  async participate(key: string, entry: string, stay: number): Promise<void> {
    const [record, participants] = this.layout.electionKeys(this.layout.lockKey(key));
    await this.commands.redisLockParticipate(participants, record, entry, stay, ELECTION_KEPT);
  }

  async election(key: string, participants: boolean): Promise<Election> {
    const lockKey = this.layout.lockKey(key);
    const reply = await this.commands.redisLockElection(
      lockKey,
      ...this.layout.electionKeys(lockKey),
      participants ? 1 : 0,
    );
    const [leads, id, fence, since, ttl, ttlLeft, transitions, now] = reply.slice(0, 8).map(String);
    return {
      leader:
        leads === '1'
          ? {
              id,
              fence: Number(fence),
              since: Number(since),
              // The lease is extended to its full TTL: it was last extended `ttl - ttlLeft` ago;
              // no earlier than the term began (its first lease is set by the grant, just before
              // the term's record).
              renewedAt: Math.max(Number(since), Number(now) - (Number(ttl) - Number(ttlLeft))),
            }
          : null,
      transitions: Number(transitions),
      // Each campaign's entry is `<random>:<id>`; two may share an id.
      participants: [
        ...new Set(reply.slice(8).map((entry) => String(entry).replace(/^[^:]*:/, ''))),
      ].sort(),
    };
  }

  async inspect(key: string): Promise<Inspection> {
    const lockKey = this.layout.lockKey(key);
    const [kind, holders, ttlLeft, fence, waiting, token] = (
      await this.commands.redisLockInspect(
        lockKey,
        this.layout.ownFenceKey(lockKey),
        this.layout.turnsKey(lockKey),
        this.layout.queueKeys(lockKey)[1],
      )
    ).map(String);
    return {
      mode: MODES[kind] ?? null,
      holders: Number(holders),
      ttlLeft: Math.max(0, Number(ttlLeft)),
      fence: fence === '-1' ? null : Number(fence),
      waiting: Number(waiting),
      token,
    };
  }

  /**
   * See `LockBackend.forceRelease`. In Redlock mode (`hold`), the force holds the key itself with
   * `hold.token` for `hold.ttl` instead of announcing (see `RedlockBackend.forceRelease`).
   */
  async forceRelease(key: string, hold?: { token: string; ttl: number }): Promise<Freed> {
    const lockKey = this.layout.lockKey(key);
    const sharded = this.shardedPubSub !== undefined && (await this.shardedPubSub());
    const command = sharded ? 'redisLockForceReleaseSharded' : 'redisLockForceRelease';
    const [kind, holders, fence] = await this.commands[command](
      lockKey,
      this.layout.ownFenceKey(lockKey),
      ...this.layout.queueKeys(lockKey),
      this.layout.shapeKeys(lockKey)[2],
      this.layout.counterKey(lockKey),
      this.layout.releaseChannel(lockKey),
      this.layout.turnChannels(lockKey),
      this.counterTtl(FORCE_COUNTER_TTL),
      ...(hold ? [hold.token, hold.ttl] : []),
    );
    const freed = Number(holders);
    return {
      mode: freed > 0 ? (MODES[String(kind)] ?? null) : null,
      holders: freed,
      fence: Number(fence),
    };
  }
}

/** What a force's fence keeps its counter for beyond the fence retention (see `counterTtl`). */
const FORCE_COUNTER_TTL = 1_000;

/** The lock key's type in Redis → the shape that holds it. */
const MODES: Record<string, Inspection['mode']> = {
  string: 'exclusive',
  zset: 'semaphore',
  hash: 'read',
};

/**
 * How long an election's record (who leads, how many terms began) is kept after the last term
 * began or the last participant renewed its stay: an hour.
 */
const ELECTION_KEPT = 3_600_000;
