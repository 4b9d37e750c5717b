import { PLAIN } from '../options/checks.js';
import type { Logger } from '@nestjs/common';
import { ReplyError, type Redis } from 'ioredis';
import { RedisLockConfigurationError } from '../errors/redis-lock.errors.js';
import type {
  AcquireAttempt,
  BackendHealth,
  Election,
  HeldLease,
  Inspection,
  Freed,
  LockBackend,
  LockShape,
  ReleaseSubscription,
} from '../interfaces/lock-backend.interface.js';
import { isRedisClient } from '../options/checks.js';
import { type RedisSource, type ResolvedModuleOptions } from '../options/module-options.js';
import { InFlight } from '../utils/in-flight.js';
import { freshToken } from '../utils/token.js';
import { createClient, versionProblem } from './connections.js';
import { Quorum, type Tally } from './quorum.js';
import { RedisLockBackend } from './redis-lock.backend.js';
import { ReleaseNotifier } from './release.notifier.js';

/** The grants of a decided acquisition round. */
function grantsOf(tally: Tally<AcquireAttempt>): Extract<AcquireAttempt, { acquired: true }>[] {
  return tally.yes.flatMap(({ value }) => (value.acquired ? [value] : []));
}

/**
 * What a generated token's fence floor adds to the lead the nodes' fences showed (µs; see
 * `RedlockBackend.learnLead`): room for the round trip's and the clocks' jitter, so that one
 * lesson serves many grants.
 */
const LEAD_MARGIN = 2_000;

/**
 * The fence of a grant by a majority (`grants`, each node's; `quorum` nodes make one). A caller's
 * own token that still holds the lock on a majority (`renewed` there) keeps the fence it was
 * granted: any such majority shares a node with the majority whose records
 * the second round settled before that grant returned; a record a node wrote at its own grant, not
 * settled yet, may differ, and counts unless a majority answers a settled one (the caller waits
 * for every node's answer where fewer do). Then the highest record is the fence: a provisional one
 * may be a sibling's, another instance's first acquisition with the token at the same moment,
 * counted after a holder with another token whom a settled record on fewer nodes predates (a
 * node that was paused kept that copy: the fence went below that holder's, found by a helper's
 * script, 5 of 10). Otherwise the
 * token does not provably hold the lock (copies a release never reached, on a minority): the
 * fence is a new one, the highest the majority answered, so that it is above every fence granted
 * since those copies' record.
 */
function holderFence(
  grants: readonly Extract<AcquireAttempt, { acquired: true }>[],
  quorum: number,
): number {
  const renewed = grants.filter((grant) => grant.renewed);
  if (renewed.length < quorum) return Math.max(...grants.map((grant) => grant.fence));
  const settled = renewed.filter((grant) => grant.settled);
  return Math.max(...(settled.length >= quorum ? settled : renewed).map((grant) => grant.fence));
}

/**
 * Redlock: one lock across N independent Redis masters, granted when a majority grants it.
 *
 * Each node keeps the same keys as a standalone deployment (lock, fence counter, release
 * channel), written by the same scripts. Every operation goes to all nodes at once, each reply
 * bounded by `commandTimeout`, and is decided as soon as a majority agrees or can no longer agree,
 * so a paused or dead minority costs no time. A lock is valid for `ttl - drift` from when its
 * attempt was sent; an attempt that does not win a majority within that is undone on every node,
 * including nodes that answer late.
 *
 * Fences: each node counts its own. A holder's fence is the highest count among the majority that
 * granted it; where those counts differ, a second round raises the counters of a majority to it
 * before the lock is granted. Any later holder's majority shares a node with that majority, where
 * the counter is already at least this fence, so its fence is higher. A caller's own token takes
 * the second round unless a majority already answered its settled record (see `holderFence`).
 */
export class RedlockBackend implements LockBackend {
  readonly replyTimeout: number;
  /** Semaphores and read locks would need their holders counted on a majority: not offered. */
  readonly shapes = false;

  /** Several keys go one by one here (each a majority round). */
  tryAcquireAll(): undefined {
    return undefined;
  }

  /** No fair locks nor read locks here (they are rejected up front): nothing to leave. */
  giveUp(): Promise<void> {
    return Promise.resolve();
  }
  private readonly quorum: number;
  /** Every node's vote on one operation (see `Quorum`). */
  private readonly votes: Quorum<RedisLockBackend>;
  private readonly notifier: ReleaseNotifier;
  /** Release messages are `<id>:<n>`: one release, announced on every node, wakes waiters once. */
  private readonly id = freshToken().slice(0, 12);
  private releases = 0;
  /**
   * The latest attempt at each key and token (`key \0 token` → its number) while an earlier one
   * may still be undone: see `tryAcquire`.
   */
  private readonly attempts = new Map<string, number>();
  private attemptCount = 0;
  /** How far the nodes' fences have run ahead of this process's clock, in µs (see `fenceFloor`). */
  private lead = 0;
  /**
   * The copies extensions may still write back, by `key \0 token`: cancelled when the holder's
   * release begins (see `extend`).
   */
  private readonly writeBacks = new Map<string, Set<{ cancelled: boolean }>>();
  /**
   * Failed attempts' undos, and releases, still waiting for a node's reply to an attempt (see
   * `undo`, `release`, `close`).
   */
  private readonly undos = new InFlight();
  /** Each node's attempts not yet answered there, by `key \0 token` (see `release`). */
  private readonly unanswered: InFlight<string>[];

  constructor(
    private readonly nodes: readonly RedisLockBackend[],
    clients: readonly Redis[],
    private readonly driftFactor: number,
    private readonly commandTimeout: number,
    logger: Logger,
  ) {
    this.votes = new Quorum(nodes, commandTimeout);
    this.unanswered = nodes.map(() => new InFlight<string>());
    this.quorum = this.votes.size;
    // An acquisition takes two rounds when the nodes' fences differ (see the class comment).
    this.replyTimeout = 2 * commandTimeout + 100;
    this.notifier = new ReleaseNotifier(clients, commandTimeout, logger);
  }

  /** Builds the backend for the module's `nodes`, creating (and then owning) the clients given as URL or options. */
  static create(
    { nodes, driftFactor }: Extract<RedisSource, { kind: 'nodes' }>,
    options: ResolvedModuleOptions,
    logger: Logger,
  ): RedlockBackend {
    const clients = nodes.map((node) =>
      isRedisClient(node)
        ? { client: node, owned: false }
        : { client: createClient(node, logger), owned: true },
    );
    if (nodes.length % 2 === 0) {
      logger.warn(
        `Redlock with ${nodes.length} nodes tolerates no more failures than with ${nodes.length - 1}: ` +
          'use an odd number of nodes.',
      );
    }
    logger.log(
      `Redlock mode: ${nodes.length} nodes, a lock needs ${Math.floor(nodes.length / 2) + 1} of them.`,
    );
    return new RedlockBackend(
      clients.map(
        ({ client, owned }) => new RedisLockBackend(client, options, owned, logger, true),
      ),
      clients.map(({ client }) => client),
      driftFactor,
      options.commandTimeout,
      logger,
    );
  }

  validity(ttl: number): number {
    return ttl - ttl * this.driftFactor - 2;
  }

  /**
   * One attempt on every node (`fresh`: a token this library generated). The holder's fence is the
   * highest the majority answered, or, for a caller's own token that already held the lock, the
   * fence it was granted then (see `holderFence`; the second round settles it on a majority, and
   * nodes that grant late are settled once they answer), so that re-acquiring with one's own
   * token keeps the fence, whichever majority answers.
   */
  async tryAcquire(
    key: string,
    token: string,
    ttl: number,
    _shape?: LockShape,
    _queue?: boolean,
    fresh = false,
  ): Promise<AcquireAttempt> {
    const sentAt = performance.now();
    const id = `${key}\0${token}`;
    const attempt = ++this.attemptCount;
    this.attempts.set(id, attempt);
    const floor = fresh ? this.fenceFloor(sentAt) : undefined;
    const round = this.votes.ask(
      (node, i) =>
        this.unanswered[i].track(node.tryAcquire(key, token, ttl, PLAIN, true, fresh, floor), id),
      (reply) => reply.acquired,
    );
    let tally = await round.decided;
    if (
      tally.yes.length + tally.no.length < this.quorum &&
      tally.failed.some(({ error }) => !(error instanceof ReplyError))
    ) {
      // Decided with fewer than a majority answering, a node among them unreachable (silent, or
      // its connection refused): whether the key is held is not known. The others' answers,
      // within `commandTimeout`, tell a refusal from a majority down (`LockQuorumError`, not a
      // busy key: it was, and `acquire()` waited out its acquireTimeout; found by a helper). A
      // node whose write Redis refused (out of memory) answered: decided at once, as before.
      tally = await this.votes.everyAnswer(round, (reply) => reply.acquired);
    }
    if (tally.yes.length >= this.quorum) {
      // A caller's own token found on some nodes of the majority only: the others may have lost
      // their copies (a restart) or the token may not hold the lock (copies a release never
      // reached). Every node's answer tells which (see `holderFence`); also where fewer than a
      // majority answered the token's settled record.
      const found = grantsOf(tally).filter((grant) => grant.renewed);
      const settled = found.filter((grant) => grant.settled).length;
      if (
        (found.length > 0 && found.length < this.quorum) ||
        (settled > 0 && settled < this.quorum)
      ) {
        tally = await this.votes.everyAnswer(round, (reply) => reply.acquired);
      }
      const grants = grantsOf(tally);
      const fence = holderFence(grants, this.quorum);
      const agreed =
        grants.filter((grant) => grant.fence === fence && (fresh || grant.settled)).length >=
        this.quorum;
      if (floor !== undefined) this.learnLead(fence, sentAt);
      const validity = this.validity(ttl);
      const raised = agreed || (await this.raiseFences(key, token, fence, ttl, !fresh));
      if (!fresh) this.raiseLateGrants(key, token, fence, ttl, round.replies, tally);
      if (raised && performance.now() - sentAt < validity) {
        if (this.attempts.get(id) === attempt) this.attempts.delete(id);
        return { acquired: true, fence, validity };
      }
    }
    if (tally.yes.length < this.quorum && this.holderCounts(tally).mayBeSplit) {
      // Decided before some nodes answered, and no holder has a majority among those that did: a
      // split vote, if those nodes do not name that holder too. Their answers tell (within
      // `commandTimeout`; on loopback, a fraction of a millisecond).
      tally = await this.votes.everyAnswer(round, (reply) => reply.acquired);
    }
    // Refused by a majority, the key is another holder's: the copies undone free nothing a
    // waiter could take, and announcing them would only wake waiters to fail again. A node whose
    // write Redis refused (out of memory) refuses every waiter's alike: it counts so.
    const refused =
      tally.no.length + tally.failed.filter(({ error }) => error instanceof ReplyError).length;
    this.undo(key, token, id, attempt, round.replies, refused < this.quorum, fresh);
    if (tally.failed.length > this.nodes.length - this.quorum) throw this.votes.failure(tally);
    const waits = tally.no.flatMap(({ value }) =>
      !value.acquired && value.retryAfter !== undefined ? [value.retryAfter] : [],
    );
    const held = tally.no.some(({ value }) => !value.acquired && value.held);
    // A split vote frees the key as soon as the other attempts' undos land: try again within
    // `retryJitter`, not at the next poll (a refusal by a holder's majority waits for its release).
    if (this.splitVote(tally)) return { acquired: false, retryAfter: 0, held, split: true };
    return { acquired: false, retryAfter: waits.length > 0 ? Math.min(...waits) : undefined, held };
  }

  /**
   * Whether a refused attempt was a split vote: the nodes that refused it name their holders, and
   * no token holds a majority of the nodes, even counting for the most frequent holder every node
   * that failed, did not answer or named none. Waiters woken by one release, each taking some
   * nodes (a link's latency apart), refuse each other so; every one undoes its copies, quietly
   * (the undo of an attempt a majority refused), and the key stays free until someone tries again:
   * for a whole `retryInterval` before (a helper measured ~1 s over 15 ms links; the benchmark's
   * hot key had a wait p99 of 1,037 ms).
   */
  private splitVote(tally: Tally<AcquireAttempt>): boolean {
    const { largest, unknown } = this.holderCounts(tally);
    return largest > 0 && largest + unknown < this.quorum;
  }

  /**
   * Of a refused attempt's tally: the most nodes one named holder has, the nodes that named none
   * (failed, not answered, or a refusal without a name), and whether it may be a split vote that
   * the nodes not answered yet would tell (see `splitVote`).
   */
  private holderCounts(tally: Tally<AcquireAttempt>): {
    largest: number;
    unknown: number;
    mayBeSplit: boolean;
  } {
    const named = new Map<string, number>();
    let unknown = this.nodes.length - tally.yes.length;
    for (const { value } of tally.no) {
      if (value.acquired || value.holder === undefined) continue;
      named.set(value.holder, (named.get(value.holder) ?? 0) + 1);
      unknown--;
    }
    const largest = named.size > 0 ? Math.max(...named.values()) : 0;
    const unanswered = this.nodes.length - tally.yes.length - tally.no.length - tally.failed.length;
    // Each node still to answer either names a holder or not: only those can make it a split.
    const split = largest > 0 && largest + unknown - unanswered < this.quorum;
    return { largest, unknown, mayBeSplit: split && unanswered > 0 };
  }

  /**
   * The floor a generated token's attempt proposes for its fence (see `ACQUIRE_REDLOCK_SCRIPT`), in
   * µs: this process's clock when the attempt was sent (`sentAt`), plus the lead the nodes' fences
   * have shown over it (`learnLead`). Where every node of a majority answers it (its clock and
   * counter are below it), they agree and no second round is sent: without it, each node's fence
   * came from its own clock and they differed at nearly every grant (one round trip more per lock
   * in the benchmark's Redlock section). A floor too low costs that round, as before; one too high
   * only moves the fences ahead of the clocks.
   */
  private fenceFloor(sentAt: number): number {
    return Math.floor((performance.timeOrigin + sentAt) * 1_000) + this.lead;
  }

  /**
   * After a grant (its `fence`, the highest a majority answered, for an attempt sent at `sentAt`):
   * the lead grows to that fence's, plus `LEAD_MARGIN`, where a node answered above the floor (its
   * clock ahead of this process's, or its counter ahead of both), so that the next floors are above
   * such a node's fences too. It never shrinks: a floor above the fences only moves them ahead.
   */
  private learnLead(fence: number, sentAt: number): void {
    const lead = fence - Math.floor((performance.timeOrigin + sentAt) * 1_000);
    if (lead > this.lead) this.lead = lead + LEAD_MARGIN;
  }

  /**
   * A failed attempt: releases what it got, on each node as soon as its reply says so, however
   * late (see `RedisLockBackend.undoCopy`: in order with the next attempt). Not once a later
   * attempt with the same token was sent: that one re-took (by re-entry) the copies this one left,
   * and keeps or undoes them itself. A late undo of an earlier attempt would otherwise delete the
   * copy of the lock the later one holds. Nor a copy the token held already there (`renewed`).
   * A caller's own token (not `fresh`) undoes a copy only while the record its grant wrote there
   * is still provisional: another instance with the same token may have re-taken the copy since,
   * and then settled it as its lock (see `UNDO_OWN_SCRIPT`; undone unconditionally, such copies
   * left that holder short of a majority and a third caller took the key: found by a helper;
   * never undone, they kept a restarted node from a holder's write-back, so that a second
   * restart gave the key to the waiter beside the live holder: found by another). Announced as
   * one release (one id on every node), so the waiters it may concern wake once, not once per
   * node; not at all unless `announce` (see `tryAcquire`).
   */
  private undo(
    key: string,
    token: string,
    id: string,
    attempt: number,
    replies: readonly Promise<AcquireAttempt>[],
    announce: boolean,
    fresh: boolean,
  ): void {
    const current = (): boolean => this.attempts.get(id) === attempt;
    const message = announce ? `${this.id}:${++this.releases}` : undefined;
    const undone = replies.map((reply, i) =>
      reply
        .then((granted) =>
          granted.acquired && !granted.renewed && current()
            ? this.nodes[i].undoCopy(key, token, message, fresh ? undefined : granted.fence)
            : undefined,
        )
        .catch(() => {
          // That copy expires after its TTL.
        }),
    );
    void this.undos.track(
      Promise.all(undone).then(() => {
        if (current()) this.attempts.delete(id);
      }),
    );
  }

  /**
   * The second round of an acquisition: resolves whether a majority now counts at least `fence`
   * (and, for a caller's `own` token, has it recorded). Sent at once to every node: on one
   * connection, it reaches each node right behind that node's grant.
   */
  private async raiseFences(key: string, token: string, fence: number, ttl: number, own: boolean) {
    const round = this.votes.ask(
      (node) => node.raiseFence(key, token, fence, ttl, own),
      (raised) => raised,
    );
    return (await round.decided).yes.length >= this.quorum;
  }

  /**
   * A caller's own token: a node whose grant answers after the decision with another fence is
   * raised again once it has answered, so that its record never keeps a fence of its own. The
   * raise sent at once may have run before that grant: a node restarted without its scripts
   * sends the grant through the `NOSCRIPT` detour, behind it (and with an agreed majority no
   * raise was sent at all). Followed as the undos are, so that shutdown waits for it.
   */
  private raiseLateGrants(
    key: string,
    token: string,
    fence: number,
    ttl: number,
    grants: readonly Promise<AcquireAttempt>[],
    tally: Tally<AcquireAttempt>,
  ): void {
    const counted = new Set(tally.yes.map(({ node }) => node));
    grants.forEach((grant, i) => {
      if (counted.has(i)) return;
      void this.undos.track(
        grant
          .then((late) =>
            late.acquired && !(late.settled && late.fence === fence)
              ? this.nodes[i].raiseFence(key, token, fence, ttl, true)
              : undefined,
          )
          .catch(() => {
            // Its copy and record expire with the lock.
          }),
      );
    });
  }

  /**
   * Extends the lock on every node: true while a majority still holds it. A node that answers in
   * time that it does not, while a majority does, forgot it (it restarted empty: nobody else can
   * hold the lock while this holder has a majority), and gets its copy back (`restoreCopy`, only
   * if the key is free there). So the restarts that can take a majority from a holder must fall
   * within one extension interval, not anywhere in a lease that auto-extension keeps for as long
   * as the work runs (a leader's whole term).
   *
   * A copy is written back only while the holder still holds: not once its release has begun
   * (a node that answers after `release()` resolved would otherwise put the released lock back
   * for a whole TTL, and the next holder would get only the other nodes), and only for what is
   * left of the holder's lease from this extension (none once it is over), never a full TTL
   * counted from when the late reply lands.
   */
  async extend(
    key: string,
    token: string,
    ttl: number,
    _shape?: LockShape,
    fence = 0,
  ): Promise<boolean> {
    const sentAt = performance.now();
    const round = this.votes.ask(
      (node) => node.extend(key, token, ttl),
      (extended) => extended,
    );
    const held = this.votes.verdict(await round.decided);
    if (held) this.restoreForgotten(key, token, fence, sentAt + this.validity(ttl), round.replies);
    return held;
  }

  /**
   * See `extend`: `until` is the end of the holder's lease (`performance.now()`); a copy written
   * back records the holder's `fence`.
   */
  private restoreForgotten(
    key: string,
    token: string,
    fence: number,
    until: number,
    replies: readonly Promise<boolean>[],
  ): void {
    const id = `${key}\0${token}`;
    const pending = { cancelled: false };
    const all = this.writeBacks.get(id) ?? new Set();
    this.writeBacks.set(id, all.add(pending));
    const restored = replies.map(
      (reply, i) =>
        this.votes
          .bounded(reply)
          .then((extended) => {
            const left = Math.floor(until - performance.now());
            if (extended || pending.cancelled || left <= 0) return false;
            return this.nodes[i].restoreCopy(key, token, left, fence);
          })
          .catch(() => false), // a node that fails now is counted out at the next round
    );
    void Promise.all(restored).then(() => {
      all.delete(pending);
      if (all.size === 0 && this.writeBacks.get(id) === all) this.writeBacks.delete(id);
    });
  }

  /**
   * Resolves true once a majority has released it, false when it was no longer held on a majority.
   * Nodes that answer later (or never: their copy expires after its TTL) do not hold it up. On a
   * node where the lock's attempt is not answered yet (frozen, or on the `NOSCRIPT` detour after
   * the node lost its scripts, whose `EVAL` would reach it after a release sent now and write the
   * released lock back for a whole TTL), the release goes once it is.
   */
  async release(
    key: string,
    token: string,
    _shape?: LockShape,
    lease?: HeldLease,
    keep = 0,
  ): Promise<boolean> {
    // With holdAtLeast: kept on a majority for what is left of it (see `LockBackend.release`).
    if (keep > 0) return this.extend(key, token, keep, PLAIN, lease?.fence);
    // No copy is written back once the release has begun (see `extend`).
    const id = `${key}\0${token}`;
    for (const pending of this.writeBacks.get(id) ?? []) pending.cancelled = true;
    this.writeBacks.delete(id);
    const message = `${this.id}:${++this.releases}`;
    const tally = await this.votes.ask(
      (node, i) => {
        const send = (): Promise<boolean> => node.release(key, token, PLAIN, undefined, 0, message);
        const attempt = this.unanswered[i].of(id);
        // Followed as the undos are: shutdown waits for it (within its deadline) before closing.
        return attempt ? this.undos.track(attempt.then(send)) : send();
      },
      (released) => released,
    ).decided;
    if (tally.yes.length >= this.quorum) return true;
    if (tally.failed.length === 0) return false;
    throw this.votes.failure(tally);
  }

  isLocked(key: string): Promise<boolean> {
    return this.votes.majority((node) => node.isLocked(key));
  }

  isHeld(key: string, token: string): Promise<boolean> {
    return this.votes.majority((node) => node.isHeld(key, token));
  }

  /**
   * Written on every node that holds the term's copy; fails unless a majority answered. A node
   * counts only the terms it held a copy of: a new term counts one more than the majority's
   * record read first, so that a node away for some terms catches up.
   */
  async recordTerm(
    key: string,
    token: string,
    id: string,
    fence: number,
    ttl: number,
  ): Promise<void> {
    const { leader, transitions } = await this.election(key, false);
    const least = leader?.fence === fence ? transitions : transitions + 1;
    return this.written((node) => node.recordTerm(key, token, id, fence, ttl, least));
  }

  participate(key: string, entry: string, stay: number): Promise<void> {
    return this.written((node) => node.participate(key, entry, stay));
  }

  private async written(write: (node: RedisLockBackend) => Promise<void>): Promise<void> {
    const tally = await this.votes.everyAnswer(
      this.votes.ask((node) => write(node).then(() => true), Boolean),
      Boolean,
    );
    if (tally.yes.length < this.quorum) throw this.votes.failure(tally);
  }

  /**
   * Held when one token holds the lock on a majority of nodes: `ttlLeft` until fewer than a
   * majority of them hold it, the fence a majority of them record; the most waiting any node knows.
   */
  async inspect(key: string): Promise<Inspection> {
    const round = this.votes.ask(
      (node) => node.inspect(key),
      () => true,
    );
    const tally = await this.votes.everyAnswer(round, () => true);
    if (tally.yes.length < this.quorum) throw this.votes.failure(tally);
    const views = tally.yes.map(({ value }) => value);
    const waiting = Math.max(...views.map((view) => view.waiting));
    const holding = views.filter(
      ({ token }) =>
        token !== '' && views.filter((other) => other.token === token).length >= this.quorum,
    );
    if (holding.length === 0) {
      return { mode: null, holders: 0, ttlLeft: 0, fence: null, waiting, token: '' };
    }
    const ttls = holding.map(({ ttlLeft }) => ttlLeft).sort((a, b) => b - a);
    const fence = holding
      .map((view) => view.fence)
      .find((each) => holding.filter((view) => view.fence === each).length >= this.quorum);
    return {
      mode: 'exclusive',
      holders: 1,
      ttlLeft: ttls[this.quorum - 1],
      fence: fence ?? null,
      waiting,
      token: holding[0].token,
    };
  }

  /**
   * Frees the key on every node that answers, as a holder of its own: each node's script puts the
   * force's token in the freed holder's place (for two rounds' time), a majority must answer (else
   * `LockQuorumError`: the holder may keep it), and where the nodes' fences differ the next round
   * raises a majority's counters to the highest (as a holder's does) right before the force
   * releases the key on each node, which announces it. So no holder takes the key on any node with
   * a fence below the force's, and the force takes two rounds, within the bound of every Redlock
   * call (2 × `commandTimeout` + 100 ms). Freed: the lock a majority of nodes held.
   */
  forceRelease(key: string): Promise<Freed> {
    // Followed from its first round on: a shutdown that begins before that round is answered
    // waits for the force's own release too (its hold stayed on every node for its TTL, and
    // nothing was announced: found by a helper, 8 of 12).
    return this.undos.track(this.force(key));
  }

  /** See `forceRelease`. */
  private async force(key: string): Promise<Freed> {
    const token = freshToken();
    const ttl = this.replyTimeout;
    const round = this.votes.ask(
      (node) => node.forceRelease(key, { token, ttl }),
      () => true,
    );
    // Its own hold, released on each node once that node answered its force (or never does): a
    // release sent before would run first on a node still on the `NOSCRIPT` detour or frozen, and
    // the force's hold would then block that node for its TTL. Behind the raise, if one is sent
    // (by `EVAL`: it runs first). Announced as one release. Followed as the undos are, so that
    // shutdown waits for it.
    const message = `${this.id}:${++this.releases}`;
    const release = (): Promise<unknown> =>
      this.undos.track(
        this.votes.ask(
          (node, i) =>
            round.replies[i]
              .catch(() => undefined)
              .then(() => node.release(key, token, PLAIN, undefined, 0, message)),
          (released) => released,
        ).decided,
      );
    const tally = await this.votes.everyAnswer(round, () => true);
    if (tally.yes.length < this.quorum) {
      void release(); // a failure is reported at once, not after this release's own bound
      throw this.votes.failure(tally);
    }
    const freed = tally.yes.map(({ value }) => value);
    const fence = Math.max(...freed.map((each) => each.fence));
    const raise =
      freed.filter((each) => each.fence === fence).length < this.quorum
        ? this.votes.ask(
            (node) => node.raiseFence(key, token, fence, ttl, false, true),
            (raised) => raised,
          ).decided
        : undefined;
    const released = release();
    const raised = await raise;
    if (raised && raised.yes.length < this.quorum) throw this.votes.failure(raised);
    await released;
    const held = freed.filter((each) => each.holders > 0).length >= this.quorum;
    return held ? { mode: 'exclusive', holders: 1, fence } : { mode: null, holders: 0, fence };
  }

  /**
   * Every node's record: the leader a majority of nodes name (by id and fence; the first such
   * node's times), the most terms any node counted, and the participants a majority list.
   */
  async election(key: string, participants: boolean): Promise<Election> {
    const round = this.votes.ask(
      (node) => node.election(key, participants),
      () => true,
    );
    const tally = await this.votes.everyAnswer(round, () => true);
    if (tally.yes.length < this.quorum) throw this.votes.failure(tally);
    const elections = tally.yes.map(({ value }) => value);
    const named = (leader: Election['leader']): string =>
      leader ? `${leader.id}\0${leader.fence}` : '';
    const leader =
      elections.find(
        ({ leader }) =>
          leader !== null &&
          elections.filter((other) => named(other.leader) === named(leader)).length >= this.quorum,
      )?.leader ?? null;
    const listed = elections.flatMap((election) => election.participants);
    return {
      leader,
      transitions: Math.max(...elections.map(({ transitions }) => transitions)),
      participants: [...new Set(listed)].filter(
        (id) => listed.filter((other) => other === id).length >= this.quorum,
      ),
    };
  }

  /**
   * Startup: refuses two nodes that are one server under two names (`127.0.0.1:6379` and
   * `localhost:6379`, a DNS alias), whose one vote would count twice, and a node older than the
   * scripts need, and a node whose Redis user may not run what the locks need: every node is
   * asked its `run_id`, version and rights within `commandTimeout`. A node that does not answer
   * then is not checked.
   * @throws RedisLockConfigurationError naming the nodes
   */
  async prepare(): Promise<void> {
    // Each node's user, beside the versions (see `RedisDeployment.checkRights`).
    const rights = Promise.all(this.nodes.map((node, i) => node.checkRights(` of nodes[${i}]`)));
    rights.catch(() => undefined); // awaited below, unless a node is refused first
    const infos = await Promise.all(this.nodes.map((node) => node.serverInfo()));
    const seen = new Map<string, number>();
    infos.forEach(({ id, version }, i) => {
      const problem = versionProblem(version);
      if (problem)
        throw new RedisLockConfigurationError(`nodes[${i}]`, `Redis ${version}`, problem);
      if (id === undefined) return;
      const earlier = seen.get(id);
      if (earlier !== undefined) {
        throw new RedisLockConfigurationError(
          `nodes[${earlier}] + nodes[${i}]`,
          id,
          'are one Redis server (the same run_id) under two names: Redlock needs independent masters, or one server counts for two votes',
        );
      }
      seen.set(id, i);
    });
    await rights;
  }

  /** Up while a majority answers; `details.nodes` has each node's own report. */
  async health(): Promise<BackendHealth> {
    const nodes = await Promise.all(this.nodes.map((node) => node.health()));
    const answering = nodes.filter((node) => node.up).length;
    return {
      up: answering >= this.quorum,
      details: {
        quorum: this.quorum,
        answering,
        nodes: nodes.map(({ up, details }) => ({ status: up ? 'up' : 'down', ...details })),
      },
    };
  }

  onReconnect(listener: () => void): () => void {
    const stops = this.nodes.map((node) => node.onReconnect(listener));
    return () => stops.forEach((stop) => stop());
  }

  hasWaiters(key: string): boolean {
    return this.notifier.watching && this.notifier.isWatched(this.nodes[0].releaseChannel(key));
  }

  /** Nobody takes turns in Redlock mode: its waiters are never handed a lock (see `watchReleases`). */
  takesTurns(): boolean {
    return false;
  }

  /** No handoffs in Redlock mode (a release would have to hand over on a majority): `claim` is unused. */
  watchReleases(key: string): ReleaseSubscription {
    return this.notifier.watch(this.nodes[0].releaseChannel(key));
  }

  /**
   * See `LockBackend.close`: the undos of failed attempts still waiting for a node's reply (an
   * attempt shutdown interrupted) are waited for first, so that none is sent after its node closed.
   */
  async close(deadline = performance.now() + this.commandTimeout): Promise<void> {
    const closing = this.notifier.close(deadline);
    await this.undos.drain(deadline);
    await Promise.all([closing, ...this.nodes.map((node) => node.close(deadline))]);
  }
}
