import assert from 'node:assert/strict';
import {
  LockAcquireAbortedError,
  LockAcquireTimeoutError,
  LockBackendError,
  RedisLockShutdownError,
  type Lock,
} from '../../lib/index.js';
import type { Stalls } from '../support/timing.js';
import type { App, Deployment } from './model-deployment.js';

/**
 * The model the steps of `model-steps.ts` run against: who holds what, in which call tree, and
 * the invariants checked after every step, at every grant and once a sequence settles:
 *
 * - never two live holders of one key: a holder is live from its grant until its signal aborts
 *   or its release is made (views and forks count); holders of one hold (its views) may be live
 *   together only along one branch of the call tree (a call and the calls nested in it), never
 *   in two branches (forks) at once; places of a semaphore never more than its limit;
 * - fences of a key strictly increase from exclusive holder to holder;
 * - once things settle, no key in Redis without a live holder (a `holdAtLeast` window aside);
 * - every call settles within its documented bound, a wait that times out waited its
 *   `acquireTimeout`, and only documented errors come out;
 * - no Node warning and no unhandled rejection;
 * - an operator's `forceRelease()`: the holders it freed are no longer live (another may take the
 *   key at once), and each is told (its signal aborts) within its TTL and `commandTimeout`.
 */

/** What a holder holds: the plain lock (a writer), a place of SEMAPHORE_LIMIT, or a read lock. */
export type Shape = 'plain' | 'place' | 'read';
export const SEMAPHORE_LIMIT = 2;

/** A point of the call tree: a flow (a section's body, a leader's term) or one call made in one. */
export interface CallNode {
  readonly id: number;
  /** The flow the call was made from; `undefined` at the top (outside any lock). */
  readonly parent: CallNode | undefined;
}

export interface Held {
  readonly id: number;
  readonly app: App;
  readonly lock: Lock;
  readonly keys: readonly string[];
  readonly shape: Shape;
  /** A re-entry: the token of a holder further up its call tree. */
  readonly view: boolean;
  readonly node: CallNode;
  /** When the model saw it granted (`performance.now()`). */
  readonly grantedAt: number;
  readonly holdAtLeast: number;
  readonly what: string;
  releases: number;
  /** When the model first released it (`performance.now()`). */
  releasedAt?: number;
  /** `checkOverrunTold` looked at its first release. */
  overrunChecked?: boolean;
  /** A release that got no answer (or found Redis gone): Redis may keep it until its TTL. */
  unconfirmed: boolean;
  /** The TTL it was granted with (ms). */
  readonly ttl: number;
  /** When the model first saw its `signal` aborted (a check after a step). */
  lostSeenAt?: number;
}

/**
 * An operator's `forceRelease()` of `key`: sent at `from`, settled at `until`; `fence` the force's
 * own, once Redis answered (it freed every holder whose fence is at or below it). Without an
 * answer it may have run or not, or may run still.
 */
export interface Force {
  readonly key: string;
  readonly from: number;
  until?: number;
  fence?: number;
}

/** Engine internals the invariants read (not part of the API). */
interface Internals {
  /** Of a hold: its release was made. Of a view: its own, or its hold's. */
  readonly released: boolean;
  /** Of a view: its own release was made. */
  readonly ended?: boolean;
  readonly swap?: unknown;
  /** Of one key's hold: why its lease ended early, and when it runs out. */
  readonly lossReason?: Error;
  readonly expiresAt?: number;
  readonly leaseTtl?: number;
  handleOf?(key: string): Internals | undefined;
}
export const internals = (lock: Lock): Internals => lock as unknown as Internals;

export class Model {
  readonly held: Held[] = [];
  /** Every `forceRelease()` of the sequence. */
  readonly forces: Force[] = [];
  /** How many holders those freed (as Redis answered). */
  freed = 0;
  /** Calls left running (waiters, forks, jobs): each settles within its own bound. */
  readonly pending: Promise<unknown>[] = [];
  /** Per key, the highest fence an exclusive holder was granted. */
  readonly fences = new Map<string, number>();
  readonly violations: string[] = [];
  /** Top-level acquisitions waiting now, by app and keys, and how to abort each. */
  readonly waiting = new Set<{
    readonly app: App;
    readonly keys: readonly string[];
    readonly abort: AbortController;
  }>();
  /**
   * Per app, the connection its callers that share one wait on (as `@WithLock` handlers share
   * their keep-alive connection's signal): a hang-up aborts every wait on it, and the holders it
   * was granted to hold on. A new one once it has aborted.
   */
  private readonly connections = new Map<App, AbortController>();
  connection(app: App): AbortController {
    let connection = this.connections.get(app);
    if (!connection || connection.signal.aborted) {
      connection = new AbortController();
      this.connections.set(app, connection);
    }
    return connection;
  }
  /**
   * An app was closed while its link to Redis was cut: what it had sent and never heard back
   * about (an attempt, an undo) reaches Redis when the link heals, after the app is gone, and a
   * lock it grants stays until its TTL. Such keys are not held by anyone the model knows.
   */
  leftBehind = false;
  /** The latency on slot 0's link now, each way (ms). */
  latencyMs = 0;
  /** Whether Redis forgot its scripts in this sequence: a first call of each costs two round trips. */
  scriptsFlushed = false;
  /**
   * `key\0token` of every caller's-own-token acquisition that failed: one given up on in flight
   * may be granted late, and its lock stays until its TTL (the README's exception: that token may
   * hold the lock legitimately, so the late grant is not undone).
   */
  readonly ownGivenUp = new Set<string>();
  /** A Redlock node was restarted empty in this sequence (once at most: see `RestartNodeStep`). */
  restarted = false;
  /**
   * An app was closed in this sequence: callers of it may have been waiting, and a place it held
   * in a queue of waiters lapses by itself, after its stay.
   */
  appClosed = false;
  private nextId = 0;

  /** k0, k1: plain locks (one key or both), leaders, jobs; k2: a semaphore; k3: read/write. */
  readonly keys: readonly string[];

  constructor(
    /** What every key of this sequence starts with. */
    readonly prefix: string,
    readonly deployment: Deployment,
    readonly commandTimeout: number,
    readonly stalls: Stalls,
    /** Unhandled rejections and Node warnings seen in this process (shared by all sequences). */
    private readonly problems: string[],
    /** What the apps logged in this sequence. */
    private readonly logs: readonly { level: string; message: string }[] = [],
  ) {
    this.keys = [0, 1, 2, 3].map((i) => `${prefix}:k${i}`);
  }

  /** Whether an app warned, about a key of this sequence, with a line that contains `text`. */
  said(text: string): boolean {
    return this.logs.some(
      ({ level, message }) =>
        level === 'warn' && message.includes(text) && message.includes(this.prefix),
    );
  }

  node(parent: CallNode | undefined): CallNode {
    return { id: this.nextId++, parent };
  }

  /** The holder recorded for `lock`, if any. */
  heldOf(lock: Lock): Held | undefined {
    return this.held.find((held) => held.lock === lock);
  }

  /**
   * A lock was granted to a call at `node`: checked against every holder the model knows, then
   * recorded.
   */
  granted(
    app: App,
    lock: Lock,
    node: CallNode,
    ttl: number,
    what: string,
    shape: Shape = 'plain',
    holdAtLeast = 0,
  ): Held {
    const now = performance.now();
    const view = this.holdersAbove(node, lock).length > 0;
    const name = `${what}: ${view ? 'view' : shape} of ${lock.keys.join('+')} (fence ${lock.fence})`;
    // A caller's own token acquired again: the same holder, another handle of its lock.
    const earlier = view
      ? []
      : this.held.filter((other) => !other.view && other.lock.token === lock.token);
    for (const key of lock.keys) {
      for (const other of earlier.filter((each) => each.keys.includes(key))) {
        // (One a force freed is no longer the token's lock: the token takes the key afresh.)
        if (
          this.live(other, key, now) &&
          !this.maybeFreed(other, key) &&
          other.lock.fences[key] !== lock.fences[key]
        ) {
          this.violations.push(
            `${name}: re-acquired with its own token, fence ${lock.fences[key]} of ${key} where its live hold #${other.id} has ${other.lock.fences[key]}`,
          );
        }
      }
    }
    if (!view) {
      if (lock.expiresAt < now - 1) {
        this.violations.push(
          `${name} granted ${(now - lock.expiresAt).toFixed(1)} ms after its lease ran out`,
        );
      }
      if (lock.expiresAt - now > ttl) {
        this.violations.push(
          `${name} believes for ${(lock.expiresAt - now).toFixed(0)} ms, over its TTL of ${ttl}`,
        );
      }
      for (const key of lock.keys) {
        const fence = lock.fences[key];
        const last = this.fences.get(key) ?? 0;
        // Exclusive holders follow one another, so their fences rise in the order seen; places and
        // read locks overlap, and one app's grant may be seen after a later one of the other's:
        // their fences are only unique.
        const again = earlier.some((other) => other.lock.fences[key] === fence);
        // (A lock a freed holder passed on in its process has a fence from the freed one's block.)
        const freed = this.forces.some(
          (force) => force.key === key && (force.fence === undefined || fence <= force.fence),
        );
        if (shape === 'plain' && fence <= last && !again && !freed) {
          this.violations.push(`${name}: fence ${fence} of ${key} not above ${last}`);
        }
        if (
          shape !== 'plain' &&
          this.held.some((other) => !other.view && other.lock.fences[key] === fence)
        ) {
          this.violations.push(`${name}: fence ${fence} of ${key} given twice`);
        }
        if (shape === 'plain') this.fences.set(key, Math.max(fence, last));
      }
    } else if (
      lock.keys.some((key) => !this.holdersAbove(node, lock).some((h) => h.keys.includes(key)))
    ) {
      this.violations.push(`${name} re-entered a key its call tree does not hold`);
    }
    const held: Held = {
      id: this.nextId++,
      app,
      lock,
      keys: lock.keys,
      shape,
      view,
      node,
      grantedAt: now,
      holdAtLeast,
      what,
      releases: 0,
      unconfirmed: false,
      ttl,
    };
    this.held.push(held);
    this.checkHolders(`at the grant of ${name}`);
    return held;
  }

  /** Holders further up `node`'s call tree with `lock`'s token. */
  private holdersAbove(node: CallNode, lock: Lock): Held[] {
    const above: Held[] = [];
    for (let at = node.parent; at; at = at.parent) {
      for (const held of this.held) {
        if (held.node === at && held.lock.token === lock.token) above.push(held);
      }
    }
    return above;
  }

  /**
   * Whether `held` is live on `key` now (see the class comment). Handles of one lock (a caller's
   * own token acquired again) share its release: one released ends those granted before it.
   */
  live(held: Held, key: string, now = performance.now()): boolean {
    const handle = internals(held.lock).handleOf?.(key) ?? internals(held.lock);
    const released = held.view && handle.ended !== undefined ? handle.ended : handle.released;
    if (!released && held.lock.signal.aborted) held.lostSeenAt ??= now;
    if (released || held.lock.signal.aborted || held.lock.expiresAt <= now) return false;
    return (
      held.view ||
      !this.held.some(
        (other) =>
          other !== held &&
          !other.view &&
          other.lock.token === held.lock.token &&
          other.keys.includes(key) &&
          other.releasedAt !== undefined &&
          other.releasedAt >= held.grantedAt,
      )
    );
  }

  /**
   * A key of a lock on several keys that another key's loss ended (its `signal` aborted): each key
   * keeps its own lease until the lock is released or the lease runs out (see `MultiKeyLock`), so
   * Redis may hold this one meanwhile, and that is no lock left behind; but its watchdog stops at
   * the loss, so the lease ends within a TTL of when the model saw the loss, never later.
   */
  private keyLeased(held: Held, key: string, now: number): boolean {
    if (held.view || held.keys.length < 2) return false;
    const handle = internals(held.lock).handleOf?.(key);
    if (handle === undefined || handle.released || handle.lossReason !== undefined) return false;
    const expiresAt = handle.expiresAt ?? 0;
    const ttl = Math.max(held.ttl, handle.leaseTtl ?? 0);
    if (held.lostSeenAt !== undefined && expiresAt > held.lostSeenAt + ttl + 1) {
      this.violations.push(
        `#${held.id} ${held.what}: ${key} kept alive after the lock was lost (lease until ${(expiresAt - held.lostSeenAt).toFixed(0)} ms after the loss was seen, TTL ${ttl})`,
      );
      held.lostSeenAt = undefined; // said once
    }
    return expiresAt > now;
  }

  /** Never two live holders, nor two live branches of one hold, on any key. */
  checkHolders(when: string): void {
    const now = performance.now();
    for (const key of this.keys) {
      const holders = this.notFreed(
        key,
        this.held.filter((held) => held.keys.includes(key) && this.live(held, key, now)),
      );
      const tokens = new Map<string, Held[]>();
      for (const held of holders) {
        tokens.set(held.lock.token, [...(tokens.get(held.lock.token) ?? []), held]);
      }
      const shapes = [...tokens.values()].map((same) => same[0].shape);
      const places = shapes.filter((shape) => shape === 'place').length;
      const writers = shapes.filter((shape) => shape === 'plain').length;
      const readers = shapes.filter((shape) => shape === 'read').length;
      if (places > SEMAPHORE_LIMIT)
        this.violations.push(`${when}: ${places} live places of ${key}`);
      if (writers > 1 || (writers > 0 && tokens.size > 1)) {
        this.violations.push(
          `${when}: ${tokens.size} live holders of ${key} (${writers} writers, ${readers} readers): ${holders.map((h) => `#${h.id} ${h.what}`).join(', ')}`,
        );
      }
      for (const same of tokens.values()) {
        for (let i = 0; i < same.length; i++) {
          for (let j = i + 1; j < same.length; j++) {
            const [a, b] = [same[i], same[j]];
            // Two handles of one lock (an own token acquired again) are one holder.
            if (!a.view && !b.view) continue;
            if (!above(a.node, b.node) && !above(b.node, a.node)) {
              this.violations.push(
                `${when}: two calls of one hold inside ${key} at once, in two branches of its call tree (#${a.id} ${a.what}, #${b.id} ${b.what}, fence ${a.lock.fences[key]})`,
              );
            }
          }
        }
      }
      for (const held of holders) {
        if (!held.view) continue;
        const holds = this.held.filter(
          (other) =>
            !other.view && other.lock.token === held.lock.token && other.keys.includes(key),
        );
        if (holds.length > 0 && !holds.some((hold) => this.live(hold, key, now))) {
          this.violations.push(
            `${when}: #${held.id} ${held.what} (a view of ${key}) live after its hold ended`,
          );
        }
      }
    }
  }

  /**
   * Once `held` was released: if its lease had run out when its first release began (unconfirmed,
   * or frozen past it), its `signal` said so. An overrun is never silent, views included.
   */
  checkOverrunTold(held: Held, what: string): void {
    const at = held.releasedAt;
    if (at === undefined || held.overrunChecked) return;
    held.overrunChecked = true;
    if (held.lock.expiresAt > at || held.lock.signal.aborted) return;
    this.violations.push(
      `${what}: #${held.id} released after its lease ran out, its signal never told`,
    );
  }

  /** An acquisition that failed: only the documented errors, a timeout only after its wait. */
  /**
   * The bound of a `tryAcquire()` by `app` of `keys`: `perKey` × `commandTimeout` a key, or three
   * `commandTimeout`s once the app has given up an attempt (no reply in time, a signal): a try
   * that finds the key held by its own given-up attempt's late grant waits for that grant's undo,
   * then tries once more (the documented 3 ×).
   */
  tryBound(app: App, keys: number, perKey = 1): number {
    return (this.gaveUp.has(app) ? Math.max(3, perKey) : perKey) * this.commandTimeout * keys;
  }

  /** Apps that gave up an attempt whose grant may still come, and be undone. */
  private readonly gaveUp = new WeakSet<App>();

  failed(what: string, error: unknown, app: App, waited?: { ms: number; timeout: number }): void {
    if (error instanceof LockAcquireTimeoutError) {
      if (error.queueFull) {
        // Refused by maxWaiters: only with at least that many other callers of the app in flight.
        const { limit, waiters } = error.queueFull;
        const counted = app.othersInFlight.get(error);
        const others = counted === undefined ? Infinity : counted[limit];
        if (others < waiters) {
          this.violations.push(
            `${what} was refused by maxWaiters.${limit} (${waiters}) with ${others} other calls in flight: ${error.message}`,
          );
        }
        return;
      }
      if (waited && waited.ms < waited.timeout - 2) {
        this.violations.push(
          `${what} timed out after ${waited.ms.toFixed(0)} ms, before its acquireTimeout of ${waited.timeout}: ${error.message}`,
        );
      }
      return;
    }
    if (error instanceof LockBackendError || error instanceof LockAcquireAbortedError) {
      this.gaveUp.add(app);
      return;
    }
    if (error instanceof RedisLockShutdownError && app.closing) return;
    this.violations.push(`${what} failed with ${String(error)}`);
  }

  /**
   * Runs `call`, checking that it settles within `bound` ms plus what the machine added (the
   * measured slack: see `watchStalls`; `floor` in its place where a bound allows less than its
   * floor, plus the event loop's stalls). One that does not is a violation, and is not waited for
   * past twice that: the sequence goes on (and fails) instead of hanging.
   */
  async bounded<T>(
    what: string,
    bound: number,
    call: () => Promise<T>,
    floor?: number,
  ): Promise<T | undefined> {
    const started = performance.now();
    const limit = (): number =>
      bound + (floor === undefined ? this.stalls.slack() : floor + this.stalls.stalled());
    let timer: NodeJS.Timeout | undefined;
    const hung = new Promise<'hung'>((resolve) => {
      timer = setTimeout(() => resolve('hung'), 2 * limit() + 1_000);
    });
    try {
      const outcome = await Promise.race([call(), hung]);
      if (outcome === 'hung') {
        this.violations.push(
          `${what} never settled (waited ${(performance.now() - started).toFixed(0)} ms, bound ${bound})`,
        );
        return undefined;
      }
      return outcome;
    } finally {
      clearTimeout(timer);
      const took = performance.now() - started;
      if (
        took > limit() &&
        !this.violations.some((line) => line.startsWith(`${what} never settled`))
      ) {
        this.violations.push(
          `${what} took ${took.toFixed(0)} ms, over its bound ${bound} ms by more than the measured slack (${(limit() - bound).toFixed(0)} ms)`,
        );
      }
    }
  }

  /** The invariants that hold between steps, against Redis too. */
  async check(): Promise<void> {
    this.checkHolders('between steps');
    const readAt = performance.now();
    const { deployment } = this;
    const [owners, ttls] = await Promise.all([
      Promise.all(this.keys.slice(0, 2).map((key) => deployment.owner(key))),
      deployment.ttls(this.prefix),
    ]);
    for (const [name, ttl] of ttls) if (ttl === -1) this.violations.push(`${name} has no TTL`);
    const now = performance.now();
    this.keys.slice(0, 2).forEach((key, i) => {
      for (const held of this.held) {
        if (held.view || held.grantedAt >= readAt || !held.keys.includes(key)) continue;
        if (!this.live(held, key, now) || this.maybeFreed(held, key)) continue;
        const handle = internals(held.lock).handleOf?.(key) ?? internals(held.lock);
        if (handle.swap === undefined && !owners[i].includes(held.lock.token)) {
          this.violations.push(
            `live holder #${held.id} ${held.what} of ${key} (fence ${held.lock.fences[key]}) not the owner in Redis (${owners[i].join(', ') || 'nobody'})`,
          );
        }
      }
    });
    this.checkFreedTold(now);
    for (const held of this.held) for (const key of held.keys) this.keyLeased(held, key, now);
    this.assertClean();
  }

  /**
   * Whether a `forceRelease()` of `key` freed `held` (or may have, one that got no answer) without
   * its knowing yet: its fence is at or below the force's (a lock its holder passed on in its
   * process, from the block of its fences, included).
   */
  private freedBy(held: Held, key: string, force: Force): boolean {
    return force.key === key && (force.fence === undefined || held.lock.fences[key] <= force.fence);
  }

  /**
   * `holders` (live, of `key`) without those a force freed: every one an answered force freed, and
   * of those an unanswered one may have freed, those a holder with a higher fence followed (it
   * took the key after the force).
   */
  private notFreed(key: string, holders: Held[]): Held[] {
    const fence = (held: Held): number => held.lock.fences[key];
    return holders.filter(
      (held) =>
        !this.forces.some(
          (force) =>
            this.freedBy(held, key, force) &&
            (force.fence !== undefined ||
              holders.some(
                (other) => other.lock.token !== held.lock.token && fence(other) > fence(held),
              )),
        ),
    );
  }

  /** Whether a force may have freed `held` (see `freedBy`). */
  maybeFreed(held: Held, key: string): boolean {
    return this.forces.some((force) => this.freedBy(held, key, force));
  }

  /**
   * Every hold a `forceRelease()` freed (its fence at or below the force's, not released before
   * the force was answered) is told within its TTL and `commandTimeout` after that answer: its
   * watchdog's next extension finds it gone (within a third of its TTL, unless Redis fails
   * meanwhile), its lease ends, or (passed on in its process) its token write is refused.
   */
  private checkFreedTold(now: number): void {
    for (const force of this.forces) {
      if (force.fence === undefined) continue;
      const answered = force.until!;
      for (const held of this.held) {
        if (held.view || !held.keys.includes(force.key) || !this.freedBy(held, force.key, force)) {
          continue;
        }
        if (held.lock.signal.aborted || held.releasedAt !== undefined || held.app.closing) continue;
        // Its own token took the key again since: the same holder, whose lock Redis holds again.
        const again = this.held.some(
          (other) =>
            !other.view &&
            other.lock.token === held.lock.token &&
            other.keys.includes(force.key) &&
            other.lock.fences[force.key] > force.fence!,
        );
        if (again) continue;
        const bound = held.ttl + this.commandTimeout;
        if (now - answered > bound + this.stalls.slack()) {
          this.violations.push(
            `#${held.id} ${held.what} freed by a forceRelease of ${force.key} ${(now - answered).toFixed(0)} ms ago, never told (bound ${bound} ms)`,
          );
          held.releasedAt = now; // said once
        }
      }
    }
  }

  assertClean(): void {
    this.violations.push(...this.problems.splice(0));
    if (this.violations.length > 0) assert.fail(this.violations.join('\n'));
  }

  /**
   * Once everything is released and nobody waits: no queue of waiters (a fair lock's, the queue of
   * waiting processes) is left behind by the callers that left it, whether they got the key or gave
   * up, unless an app closed while callers of it waited (its places lapse after their stay).
   * Polled for a while: a give-up goes out once its last attempt is answered.
   */
  async checkNothingQueued(when: string): Promise<void> {
    if (this.appClosed || this.leftBehind) return;
    const queued = async (): Promise<string[]> =>
      (await this.deployment.ttls(this.prefix))
        .map(([name]) => name)
        .filter((name) => /:(queue|queue:stay|turns)$/.test(name));
    const deadline = performance.now() + 2 * this.commandTimeout + 500;
    let left = await queued();
    while (left.length > 0 && performance.now() < deadline) {
      await new Promise((resolve) => setTimeout(resolve, 50));
      left = await queued();
    }
    if (left.length > 0) this.violations.push(`${when}: ${left.join(', ')} left behind`);
  }

  /**
   * Once things settle: every token Redis holds under a model key is a live holder's, or one whose
   * release went unanswered, or one `holdAtLeast` keeps. Polled for a while: an abandoned
   * attempt's late grant is undone within two `commandTimeout`s.
   */
  async checkNothingKept(when: string): Promise<void> {
    const deadline = performance.now() + 2 * this.commandTimeout + 500;
    let strays: string[] = [];
    do {
      strays = [];
      const now = performance.now();
      for (const key of this.keys) {
        for (const token of await this.deployment.copies(key)) {
          const known = this.held.filter(
            (held) => held.lock.token === token && held.keys.includes(key),
          );
          const kept = known.some(
            (held) =>
              this.live(held, key, now) ||
              this.keyLeased(held, key, now) ||
              held.unconfirmed ||
              (held.holdAtLeast > 0 && held.grantedAt + held.holdAtLeast + 50 > now),
          );
          const excused =
            (known.length === 0 && this.leftBehind) || this.ownGivenUp.has(`${key}\0${token}`);
          if (!kept && !excused) {
            strays.push(
              known.length === 0
                ? `${key} held in Redis by a token no holder was given`
                : `${key} held in Redis by #${known[0].id} ${known[0].what}, no longer live`,
            );
          }
        }
      }
      if (strays.length === 0) return;
      await new Promise((resolve) => setTimeout(resolve, 50));
    } while (performance.now() < deadline);
    this.violations.push(...strays.map((stray) => `${when}: ${stray}`));
  }
}

/** Whether `a` is `b` or further up its call tree. */
function above(a: CallNode, b: CallNode): boolean {
  for (let at: CallNode | undefined = b; at; at = at.parent) if (at === a) return true;
  return false;
}
