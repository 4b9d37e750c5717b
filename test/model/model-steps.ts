import fc from 'fast-check';
import {
  getCurrentLock,
  LeaderElectionTimeoutError,
  LeadershipStoppedError,
  LockAcquireTimeoutError,
  LockBackendError,
  LockLostError,
  RedisLockShutdownError,
  type AcquireOptions,
  type Lock,
  type Leadership,
} from '../../lib/index.js';
import { RELEASE_FAIR_SCRIPT, RELEASE_FAIR_SHARDED_SCRIPT } from '../../lib/redis/fair.scripts.js';
import {
  ACQUIRE_SCRIPT,
  ACQUIRE_UNRESERVED_SCRIPT,
  DROP_MARK_SCRIPT,
} from '../../lib/redis/lock.scripts.js';
import * as lockScriptsOf from '../../lib/redis/lock.scripts.js';
import * as shapeScriptsOf from '../../lib/redis/shape.scripts.js';
import * as fairScriptsOf from '../../lib/redis/fair.scripts.js';
import * as electionScriptsOf from '../../lib/redis/election.scripts.js';
import * as inspectScriptsOf from '../../lib/redis/inspect.scripts.js';
import { MODEL_MAX_WAITERS, type App, type Deployment } from './model-deployment.js';
import {
  SEMAPHORE_LIMIT,
  type CallNode,
  type Force,
  type Held,
  type Model,
  type Shape,
  internals,
} from './model-state.js';

/**
 * The steps of the model-based suite (fast-check `commands`), each one thing an app does: take
 * locks (one key or two, every shape, `holdAtLeast`, waiting or not), open sections and nest in
 * them at any depth (awaited, forked side by side, from a timer, forks that outlive their
 * section, nested `acquire()` views that are forgotten), run `@WithLock` jobs that skip when busy,
 * campaign for leadership and stop it from outside or from inside its work, close an app at any
 * moment (with a release or an attempt on its way, its link cut), and slow or cut the link of the
 * app in slot 0, make Redis forget its scripts, or take the lock channels from the apps. Each is written as JSON (`toString`), so that a
 * sequence that failed can be kept and replayed as it is (see `replay`).
 */

/** The module's default TTL: a nested call leaves it out (it re-enters, or takes the key afresh). */
export const DEFAULT_TTL = 10_000;
const KEY_SETS = [[0], [1], [0, 1]] as const;
const TTLS = [50, 150, 300, 1_000, 30_000] as const;

/** What the steps drive: the apps (one per slot, replaced when closed), flows and leaderships. */
export interface Real {
  readonly deployment: Deployment;
  readonly apps: App[];
  generations: number;
  readonly flows: Flow[];
  readonly leaders: Leader[];
}

/**
 * A flow of calls holding a lock: a `using()` section's body, or a leader's term, running what
 * the steps send it, in its own call chain (so calls it makes are nested in its hold).
 */
export class Flow {
  readonly node: CallNode;
  held: Held | undefined;
  /** The nested section it awaits: meanwhile it takes no steps. */
  inner: Flow | undefined;
  /** Its body returned (or never started). */
  ended = false;
  private readonly queue: (() => Promise<void>)[] = [];
  private wake: (() => void) | undefined;
  private closing = false;
  private opened!: (ok: boolean) => void;
  readonly started = new Promise<boolean>((resolve) => (this.opened = resolve));
  /** Settles when the body is over: its section's outcome (an error, or `undefined`). */
  done: Promise<unknown> = Promise.resolve();

  constructor(
    readonly app: App,
    readonly keys: readonly string[],
    readonly parent: Flow | undefined,
    model: Model,
    readonly what: string,
    /** A leader's term: its signal ends the body, and the bodies of the flows nested in it. */
    readonly term: AbortSignal | undefined = parent?.term,
  ) {
    this.node = model.node(parent?.node);
  }

  get active(): boolean {
    return (
      this.held !== undefined &&
      !this.ended &&
      !this.closing &&
      !this.inner &&
      !this.app.closing &&
      !this.term?.aborted
    );
  }

  /**
   * Starts the flow as a `using()` section of `app` on its keys, from the calling chain (so the
   * section is nested in whatever that chain holds).
   */
  open(model: Model, options: AcquireOptions, ttl: number): Promise<unknown> {
    const key = this.keys.length === 1 ? this.keys[0] : this.keys;
    this.done = this.app.locks
      .using(key, (lock) => this.body(model, lock, ttl), options)
      .then(
        () => undefined,
        (error: unknown) => error,
      )
      .finally(() => {
        this.ended = true;
        this.opened(false);
        if (this.held) model.checkOverrunTold(this.held, this.what);
      });
    return this.done;
  }

  /** The body: records its lock, then runs what it is sent until closed (or its term ends). */
  async body(model: Model, lock: Lock, ttl: number): Promise<void> {
    this.held = model.granted(this.app, lock, this.node, ttl, this.what);
    this.opened(true);
    const ended = this.term;
    const onEnd = (): void => this.wake?.();
    ended?.addEventListener('abort', onEnd);
    try {
      for (;;) {
        const next = this.queue.shift();
        if (next) await next();
        else if (this.closing || ended?.aborted) return;
        else await new Promise<void>((resolve) => (this.wake = resolve));
      }
    } finally {
      ended?.removeEventListener('abort', onEnd);
      // `using()` releases it now.
      if (this.held) this.held.releasedAt ??= performance.now();
    }
  }

  /** Runs `fn` inside the flow, in its call chain. */
  run<T>(fn: () => Promise<T>): Promise<T> {
    return new Promise<T>((resolve, reject) => {
      this.queue.push(() => fn().then(resolve, reject));
      this.wake?.();
    });
  }

  close(): Promise<unknown> {
    this.closing = true;
    this.wake?.();
    return this.done;
  }
}

/** A leadership campaigned for by a step, its current term a `Flow`. */
export interface Leader {
  readonly app: App;
  readonly key: string;
  readonly leadership: Leadership;
  term: Flow | undefined;
  stopped: boolean;
  /** The fences of the terms its work was given. */
  readonly fences: number[];
  /** When its `stop()` was first called, by a step or by its app's shutdown. */
  stopCalledAt?: number;
  /** When its `stop()` first resolved: its term over, its lock released (or given up on). */
  stoppedAt?: number;
}

/** A step: one thing an app does, written and read as JSON (`[kind, ...args]`). */
abstract class Step implements fc.AsyncCommand<Model, Real> {
  abstract readonly kind: string;
  abstract readonly args: readonly (string | number | boolean)[];
  check(_model: Readonly<Model>): boolean {
    return true;
  }
  abstract run(model: Model, real: Real): Promise<void>;
  toString(): string {
    return JSON.stringify([this.kind, ...this.args]);
  }
}

/** The scripts a waiter's give-up runs (see `FlushScriptsStep`). */
const GIVE_UP_SCRIPTS = [RELEASE_FAIR_SCRIPT, RELEASE_FAIR_SHARDED_SCRIPT, DROP_MARK_SCRIPT];
/** The plain lock's acquisitions: what another instance's attempt loads again. */
const ACQUIRE_SCRIPTS = [ACQUIRE_SCRIPT, ACQUIRE_UNRESERVED_SCRIPT];

/**
 * Every script the library runs, loaded on every server as each sequence begins (see
 * `runSequence`): a sequence starts on a Redis that has them, as an app's long-running Redis
 * does, whatever an earlier sequence did; only its own `flush` steps take them away.
 */
export const ALL_SCRIPTS = [
  lockScriptsOf,
  shapeScriptsOf,
  fairScriptsOf,
  electionScriptsOf,
  inspectScriptsOf,
]
  .flatMap((module) => Object.entries(module))
  .filter(
    (entry): entry is [string, string] =>
      entry[0].endsWith('_SCRIPT') && typeof entry[1] === 'string',
  )
  .map(([, lua]) => lua);

/** What the steps of `model`'s sequence drive (fast-check's `check` is given the model only). */
const driven = new WeakMap<object, Real>();
export const drive = (model: Model, real: Real): void => void driven.set(model, real);
const realOf = (model: Readonly<Model>): Real => driven.get(model)!;

/** The open flows a step can act in (not waiting on a nested section, not ending). */
const activeFlows = (real: Real): Flow[] => real.flows.filter((flow) => flow.active);

/** A lock's options for `acquire()` from the top level: one key or both, waiting or not. */
class AcquireStep extends Step {
  readonly kind = 'acquire';
  constructor(
    readonly slot: number,
    readonly keySet: number,
    readonly ttl: number,
    readonly wait: 'try' | 0 | 300 | 1_500 | 3_000,
    readonly autoExtend: boolean,
    readonly holdAtLeast: number,
    /** A waiter's caller that gives up this soon (ms; 0: never), its first attempt on its way. */
    readonly quitAfter = 0,
    /**
     * Whether the call waits on its app's shared connection (see `Model.connection`): giving up
     * (`quitAfter`, an `abort` step) hangs up every wait on it.
     */
    readonly connection = false,
  ) {
    super();
  }
  get args() {
    const args = [this.slot, this.keySet, this.ttl, this.wait, this.autoExtend, this.holdAtLeast];
    if (this.connection) return [...args, this.quitAfter, true];
    return this.quitAfter > 0 ? [...args, this.quitAfter] : args;
  }
  async run(model: Model, real: Real): Promise<void> {
    const keys = KEY_SETS[this.keySet].map((i) => model.keys[i]);
    const key = keys.length === 1 ? keys[0] : keys;
    const app = real.apps[this.slot];
    const holdAtLeast = Math.min(this.holdAtLeast, this.ttl);
    const options = { ttl: this.ttl, autoExtend: this.autoExtend, holdAtLeast };
    const what = this.toString();
    const node = model.node(undefined);
    if (this.wait === 'try') {
      const lock = await model.bounded(what, model.tryBound(app, keys.length, 2), () =>
        app.locks.tryAcquire(key, options).catch((error: unknown) => {
          model.failed(what, error, app);
          return null;
        }),
      );
      if (lock) model.granted(app, lock, node, this.ttl, what, 'plain', holdAtLeast);
    } else {
      const acquireTimeout = this.wait;
      const started = performance.now();
      const abort = this.connection ? model.connection(app) : new AbortController();
      const waiter = { app, keys, abort };
      model.waiting.add(waiter);
      const { signal } = waiter.abort;
      const quit = quitting(waiter.abort, this.quitAfter);
      const call = model
        .bounded(what, acquireTimeout + model.tryBound(app, keys.length, 2), () =>
          app.locks.acquire(key, { ...options, acquireTimeout, signal }),
        )
        .then(
          (lock) => lock && model.granted(app, lock, node, this.ttl, what, 'plain', holdAtLeast),
          (error: unknown) =>
            model.failed(what, error, app, {
              ms: performance.now() - started,
              timeout: acquireTimeout,
            }),
        )
        .finally(() => {
          clearTimeout(quit);
          model.waiting.delete(waiter);
        });
      // A wait is left running (a waiter, in its app's queue); an attempt is awaited.
      if (acquireTimeout > 0) model.pending.push(call);
      else await call;
    }
    await model.check();
  }
}

/**
 * `acquire()` of k0 or k1 with a caller's own token (one of two, shared by both apps): acquired
 * again while it holds the key, it must get the same fence.
 */
class AcquireOwnStep extends Step {
  readonly kind = 'own';
  constructor(
    readonly slot: number,
    readonly key: number,
    readonly token: number,
    readonly ttl: number,
    readonly wait: 0 | 300,
  ) {
    super();
  }
  get args() {
    return [this.slot, this.key, this.token, this.ttl, this.wait];
  }
  async run(model: Model, real: Real): Promise<void> {
    const app = real.apps[this.slot];
    const key = model.keys[this.key];
    const what = this.toString();
    const token = `own-${this.token}-${model.prefix}`;
    const started = performance.now();
    const lock = await model.bounded(what, this.wait + model.tryBound(app, 1, 2), () =>
      app.locks
        .acquire(key, { token, ttl: this.ttl, acquireTimeout: this.wait })
        .catch((error: unknown) => {
          model.ownGivenUp.add(`${key}\0${token}`);
          model.failed(what, error, app, { ms: performance.now() - started, timeout: this.wait });
          return undefined;
        }),
    );
    if (lock) model.granted(app, lock, model.node(undefined), this.ttl, what);
    await model.check();
  }
}

/**
 * A server stops for everyone for a while (`CLIENT PAUSE`): in Redlock mode, one node. The other
 * faults of one node (`ms` their amount) override `check` and `apply`.
 */
class PauseNodeStep extends Step {
  readonly kind: string = 'pause';
  constructor(
    readonly node: number,
    readonly ms: number,
  ) {
    super();
  }
  get args() {
    return [this.node, this.ms];
  }
  override check(model: Readonly<Model>): boolean {
    return model.deployment.faults;
  }
  /** The fault, on `node` of `deployment`'s servers. */
  protected apply(deployment: Deployment, node: number): Promise<void> {
    return deployment.pauseNode(node, this.ms);
  }
  async run(model: Model, real: Real): Promise<void> {
    await this.apply(real.deployment, this.node % real.deployment.nodes);
    await model.check();
  }
}

/**
 * Redlock mode: a node restarts empty (no persistence), once per sequence, and only while every
 * live lock has its copy on every node: then each still has a majority, and nobody else may take
 * it (a second restart, or a lock on two nodes only, is the loss the README says it cannot
 * prevent). Its scripts and fence counter are gone too.
 */
class RestartNodeStep extends Step {
  readonly kind = 'restart';
  constructor(readonly node: number) {
    super();
  }
  get args() {
    return [this.node];
  }
  override check(model: Readonly<Model>): boolean {
    return model.deployment.restartNode !== undefined && !model.restarted;
  }
  async run(model: Model, real: Real): Promise<void> {
    const { deployment } = real;
    const now = performance.now();
    for (const key of model.keys) {
      const live = model.held.filter(
        (held) => held.keys.includes(key) && model.live(held, key, now),
      );
      const copies = await deployment.perNode!(key);
      if (live.some((held) => copies.some((tokens) => !tokens.includes(held.lock.token)))) {
        await model.check();
        return; // a lock on fewer nodes than all: this restart could take its majority
      }
    }
    model.restarted = true;
    await deployment.restartNode!(this.node % deployment.nodes);
    await model.check();
  }
}

/**
 * Redlock mode: one node runs out of memory for `ms`: it refuses every write at once (waiters
 * beside a holder that lost a copy elsewhere must not spin on it: found by a helper).
 */
class OutOfMemoryStep extends PauseNodeStep {
  override readonly kind = 'oom';
  override check(model: Readonly<Model>): boolean {
    return model.deployment.outOfMemory !== undefined;
  }
  protected override apply(deployment: Deployment, node: number): Promise<void> {
    return deployment.outOfMemory!(node, this.ms);
  }
}

/**
 * Redlock mode: one node's fence counter jumps ahead by `ms` µs (a clock ahead of the others'):
 * the next grants there answer above the apps' fence floors, a second round raises the others,
 * and the apps learn the lead. Fences must keep increasing, whichever majority answers.
 */
class CounterAheadStep extends PauseNodeStep {
  override readonly kind = 'ahead';
  override check(model: Readonly<Model>): boolean {
    return model.deployment.counterAhead !== undefined;
  }
  protected override apply(deployment: Deployment, node: number): Promise<void> {
    return deployment.counterAhead!(node, this.ms);
  }
}

/**
 * A place in the semaphore (k2), a read or write lock (k3), or a fair lock on k0 (which other
 * steps take unfairly: fairness binds those who ask for it, exclusion everyone).
 */
class ShapeStep extends Step {
  readonly kind = 'shape';
  constructor(
    readonly slot: number,
    readonly shape: 'place' | 'read' | 'write' | 'fair',
    readonly ttl: number,
    readonly wait: 'try' | 300,
    /** See `AcquireStep.quitAfter`. */
    readonly quitAfter = 0,
  ) {
    super();
  }
  get args() {
    const args = [this.slot, this.shape, this.ttl, this.wait];
    return this.quitAfter > 0 ? [...args, this.quitAfter] : args;
  }
  override check(model: Readonly<Model>): boolean {
    return model.deployment.shapes;
  }
  async run(model: Model, real: Real): Promise<void> {
    const key = model.keys[{ place: 2, read: 3, write: 3, fair: 0 }[this.shape]];
    const options: AcquireOptions =
      this.shape === 'place'
        ? { ttl: this.ttl, limit: SEMAPHORE_LIMIT }
        : this.shape === 'fair'
          ? { ttl: this.ttl, fair: true }
          : { ttl: this.ttl, mode: this.shape };
    const shape: Shape = this.shape === 'write' || this.shape === 'fair' ? 'plain' : this.shape;
    const app = real.apps[this.slot];
    const what = this.toString();
    const node = model.node(undefined);
    if (this.wait === 'try') {
      const lock = await model.bounded(what, model.tryBound(app, 1), () =>
        app.locks.tryAcquire(key, options).catch((error: unknown) => {
          model.failed(what, error, app);
          return null;
        }),
      );
      if (lock) model.granted(app, lock, node, this.ttl, what, shape);
    } else {
      const acquireTimeout = this.wait;
      const started = performance.now();
      const waiter = { app, keys: [key], abort: new AbortController() };
      model.waiting.add(waiter);
      const { signal } = waiter.abort;
      const quit = quitting(waiter.abort, this.quitAfter);
      model.pending.push(
        model
          .bounded(what, acquireTimeout + model.tryBound(app, 1, 2), () =>
            app.locks.acquire(key, { ...options, acquireTimeout, signal }),
          )
          .then(
            (lock) => lock && model.granted(app, lock, node, this.ttl, what, shape),
            (error: unknown) =>
              model.failed(what, error, app, {
                ms: performance.now() - started,
                timeout: acquireTimeout,
              }),
          )
          .finally(() => {
            clearTimeout(quit);
            model.waiting.delete(waiter);
          }),
      );
    }
    await model.check();
  }
}

const WENT_AWAY = new Error('the caller went away');

/** Aborts a waiter `ms` after now (a caller that gives up at once; 0: never). */
function quitting(abort: AbortController, ms: number): NodeJS.Timeout | undefined {
  return ms > 0 ? setTimeout(() => abort.abort(WENT_AWAY), ms) : undefined;
}

/** A waiter's caller gives up: its `AbortSignal` aborts (a client that went away). */
class AbortStep extends Step {
  readonly kind = 'abort';
  constructor(readonly pick: number) {
    super();
  }
  get args() {
    return [this.pick];
  }
  override check(model: Readonly<Model>): boolean {
    return model.waiting.size > 0;
  }
  async run(model: Model): Promise<void> {
    const waiters = [...model.waiting];
    waiters[this.pick % waiters.length].abort.abort(WENT_AWAY);
    await model.check();
  }
}

/**
 * Releases a holder (a lock, a view, a section's hold from outside), maybe twice; in the
 * `background`, the next steps go on while it is on its way (as a request's `finally` releases
 * while the app serves others): a waiter of its app giving up, another release, a fault.
 */
class ReleaseStep extends Step {
  readonly kind = 'release';
  constructor(
    readonly pick: number,
    readonly twice: boolean,
    readonly background = false,
  ) {
    super();
  }
  get args() {
    return this.background ? [this.pick, this.twice, true] : [this.pick, this.twice];
  }
  override check(model: Readonly<Model>): boolean {
    return model.held.length > 0;
  }
  async run(model: Model): Promise<void> {
    const held = model.held[this.pick % model.held.length];
    const released = release(model, held, this.toString(), this.twice ? 2 : 1);
    if (this.background) model.pending.push(released);
    else await released;
    await model.check();
  }
}

/** Releases `held` `times` times: the second answers `false`; a failure only `LockBackendError`. */
async function release(model: Model, held: Held, what: string, times = 1): Promise<void> {
  held.releasedAt ??= performance.now();
  for (let i = 0; i < times; i++) {
    // A lock its app's shutdown did not release (lost before), released after: no connection.
    const afterClose = held.app.closedAt !== undefined;
    // Counted as it is called: a release in the background may answer after a later one.
    const nth = held.releases++;
    const answer = await model.bounded(what, 2 * model.commandTimeout, () =>
      held.lock.release().catch((error: unknown) => error),
    );
    model.checkOverrunTold(held, what);
    // Only a Redis that did not answer in time may leave the lock in place (until its TTL): a
    // release cut off by the app's own shutdown, or failing otherwise, is a fault of the library.
    if (answer instanceof LockBackendError && (answer.timedOut || afterClose)) {
      held.unconfirmed = true;
    } else if (answer instanceof Error) {
      model.violations.push(`${what}: release of #${held.id} failed with ${String(answer)}`);
    }
    if (nth > 0 && answer !== false) {
      model.violations.push(
        `release ${nth + 1} of #${held.id} (${held.view ? 'a view' : 'a lock'}) answered ${String(answer)}`,
      );
    }
  }
}

class ExtendStep extends Step {
  readonly kind = 'extend';
  constructor(
    readonly pick: number,
    readonly ttl: number,
  ) {
    super();
  }
  get args() {
    return [this.pick, this.ttl];
  }
  override check(model: Readonly<Model>): boolean {
    return model.held.length > 0;
  }
  async run(model: Model): Promise<void> {
    const held = model.held[this.pick % model.held.length];
    // One of two live handles of a lock (an own token acquired again): an explicit extension
    // through one changes the lock for both, and only that one knows its new lease (the README
    // says so); not what the model checks.
    const now = performance.now();
    const aliases = model.held.filter(
      (other) =>
        other !== held &&
        !other.view &&
        other.lock.token === held.lock.token &&
        other.keys.some((key) => model.live(other, key, now)),
    );
    if (!held.view && aliases.length > 0) return model.check();
    await model.bounded(this.toString(), 2 * model.commandTimeout, () =>
      held.lock.extend(this.ttl).catch((error: unknown) => {
        if (!(error instanceof LockLostError || error instanceof LockBackendError)) {
          model.violations.push(`extend of #${held.id} failed with ${String(error)}`);
        }
      }),
    );
    await model.check();
  }
}

class SleepStep extends Step {
  readonly kind = 'sleep';
  constructor(readonly ms: number) {
    super();
  }
  get args() {
    return [this.ms];
  }
  async run(model: Model): Promise<void> {
    await new Promise((resolve) => setTimeout(resolve, this.ms));
    await model.check();
  }
}

/** Slot 0's link to Redis slowed (each way), or back to normal. */
class LatencyStep extends Step {
  readonly kind = 'latency';
  constructor(readonly ms: number) {
    super();
  }
  get args() {
    return [this.ms];
  }
  override check(model: Readonly<Model>): boolean {
    return model.deployment.faults;
  }
  async run(model: Model, real: Real): Promise<void> {
    real.deployment.latency(this.ms);
    model.latencyMs = this.ms;
    await model.check();
  }
}

/** A partition of slot 0 from Redis: nothing crosses for `ms`, then everything sent arrives. */
class StallStep extends Step {
  readonly kind = 'stall';
  constructor(readonly ms: number) {
    super();
  }
  get args() {
    return [this.ms];
  }
  override check(model: Readonly<Model>): boolean {
    return model.deployment.faults;
  }
  async run(model: Model, real: Real): Promise<void> {
    real.deployment.stall();
    await new Promise((resolve) => setTimeout(resolve, this.ms));
    real.deployment.heal();
    await model.check();
  }
}

/**
 * Redis forgets its scripts (as after a restart or a failover): they are loaded again. With
 * `reload`, another instance's give-ups (a fair waiter leaving the queue, a writer's mark dropped)
 * have loaded theirs again already, while an attempt still takes the `NOSCRIPT` detour; with
 * `reload: 'acquire'`, another instance's acquisitions have, while a release takes it; with
 * `slow`, slot 0's link is slow from then on (150 ms each way, as while clients reconnect after a
 * failover), so that what it sends next is on that detour for a while.
 */
class FlushScriptsStep extends Step {
  readonly kind = 'flush';
  constructor(
    readonly reload: boolean | 'acquire' = false,
    readonly slow = false,
  ) {
    super();
  }
  get args() {
    return this.reload || this.slow ? [this.reload, this.slow] : [];
  }
  override check(model: Readonly<Model>): boolean {
    return model.deployment.faults;
  }
  async run(model: Model, real: Real): Promise<void> {
    await real.deployment.flushScripts(
      this.reload === 'acquire' ? ACQUIRE_SCRIPTS : this.reload ? GIVE_UP_SCRIPTS : [],
    );
    model.scriptsFlushed = true;
    if (this.slow) {
      real.deployment.latency(150);
      model.latencyMs = 150;
    }
    await model.check();
  }
}

/**
 * The apps' Redis user loses the lock channels (a least-privilege user without `&lock:*`), or gets
 * them back: releases cannot announce (they still release, and say so), Redis drops the
 * subscriptions, waiters find free keys at their timed attempts, apps started meanwhile only warn.
 */
class ChannelsStep extends Step {
  readonly kind = 'channels';
  constructor(readonly allowed: boolean) {
    super();
  }
  get args() {
    return [this.allowed];
  }
  override check(model: Readonly<Model>): boolean {
    return model.deployment.faults;
  }
  async run(model: Model, real: Real): Promise<void> {
    await real.deployment.channels(this.allowed);
    await model.check();
  }
}

/** A `using()` section at the top level, left open for the steps to nest in. */
class OpenStep extends Step {
  readonly kind = 'open';
  constructor(
    readonly slot: number,
    readonly keySet: number,
    readonly ttl: number,
    readonly autoExtend: boolean,
  ) {
    super();
  }
  get args() {
    return [this.slot, this.keySet, this.ttl, this.autoExtend];
  }
  async run(model: Model, real: Real): Promise<void> {
    const keys = KEY_SETS[this.keySet].map((i) => model.keys[i]);
    const app = real.apps[this.slot];
    const what = this.toString();
    const flow = new Flow(app, keys, undefined, model, what);
    real.flows.push(flow);
    const options = { ttl: this.ttl, acquireTimeout: 0, autoExtend: this.autoExtend };
    const started = performance.now();
    void flow.open(model, options, this.ttl).then((error) => {
      if (error !== undefined && flow.held === undefined) {
        model.failed(what, error, app, { ms: performance.now() - started, timeout: 0 });
      }
    });
    await model.bounded(what, 2 * model.commandTimeout * keys.length, () => flow.started);
    await model.check();
  }
}

/**
 * In an open flow: a nested `using()` section it awaits (straight nesting: the flow takes no steps
 * until it closes), or a nested `acquire()` whose view is left open (forgotten, unless a release
 * step picks it).
 */
class NestStep extends Step {
  readonly kind = 'nest';
  constructor(
    readonly pick: number,
    readonly how: 'using' | 'acquire',
    readonly wait: 0 | 300,
  ) {
    super();
  }
  get args() {
    return [this.pick, this.how, this.wait];
  }
  override check(model: Readonly<Model>): boolean {
    return activeFlows(realOf(model)).length > 0;
  }
  async run(model: Model, real: Real): Promise<void> {
    const flows = activeFlows(real);
    const parent = flows[this.pick % flows.length];
    const what = `${this.toString()} in ${parent.what}`;
    const { app } = parent;
    const key = parent.keys.length === 1 ? parent.keys[0] : parent.keys;
    const options = { acquireTimeout: this.wait };
    if (this.how === 'using') {
      const child = new Flow(app, parent.keys, parent, model, what);
      real.flows.push(child);
      void parent.run(async () => {
        const straight = straightNesting(model, child.node, parent.keys);
        parent.inner = child;
        const started = performance.now();
        const error = await child.open(model, options, DEFAULT_TTL);
        parent.inner = undefined;
        // Re-entering a hold that was lost throws its LockLostError.
        if (error !== undefined && child.held === undefined && !(error instanceof LockLostError)) {
          const waited = { ms: performance.now() - started, timeout: this.wait };
          if (error instanceof LockAcquireTimeoutError && straight) {
            model.violations.push(`${what}: straight nesting waited: ${error.message}`);
          }
          model.failed(what, error, app, waited);
        }
      });
      // As for any call on those keys: a reply per key (an attempt on all at once first, then one
      // per key taken one after another), each within commandTimeout, twice after NOSCRIPT.
      await model.bounded(
        what,
        this.wait + model.tryBound(app, parent.keys.length, 2),
        () => child.started,
      );
    } else {
      const node = model.node(parent.node);
      await model.bounded(what, this.wait + model.tryBound(app, parent.keys.length, 2), () =>
        parent.run(async () => {
          const straight = straightNesting(model, node, parent.keys);
          const started = performance.now();
          try {
            const lock = await app.locks.acquire(key, options);
            model.granted(app, lock, node, DEFAULT_TTL, what);
          } catch (error) {
            if (error instanceof LockAcquireTimeoutError && straight) {
              model.violations.push(`${what}: straight nesting waited: ${error.message}`);
            }
            if (!(error instanceof LockLostError)) {
              model.failed(what, error, app, {
                ms: performance.now() - started,
                timeout: this.wait,
              });
            }
          }
        }),
      );
    }
    await model.check();
  }
}

/**
 * Whether a call at `node` on `keys` nests straight in live holds: every live holder of those keys
 * with its holds' token is a caller of it. Then it must never wait (a fork, a forgotten view or a
 * call still inside elsewhere in the tree makes it wait its turn instead).
 */
function straightNesting(model: Model, node: CallNode, keys: readonly string[]): boolean {
  const now = performance.now();
  const callers = new Set<CallNode>();
  for (let at = node.parent; at; at = at.parent) callers.add(at);
  const holds = model.held.filter(
    (held) => callers.has(held.node) && keys.every((key) => held.keys.includes(key)),
  );
  if (!holds.some((hold) => keys.every((key) => model.live(hold, key, now)))) return false;
  const tokens = new Set(holds.map((hold) => hold.lock.token));
  return model.held.every(
    (held) =>
      !tokens.has(held.lock.token) ||
      callers.has(held.node) ||
      !held.keys.some((key) => keys.includes(key) && model.live(held, key, now)),
  );
}

/**
 * Calls forked inside an open flow: `count` nested `using()` run side by side, each inside for a
 * moment, maybe one more from a timer that the flow does not wait for, and maybe one that stays
 * open (a flow of its own, not awaited: it may outlive its parent).
 */
class ForkStep extends Step {
  readonly kind = 'fork';
  constructor(
    readonly pick: number,
    readonly count: number,
    readonly timer: boolean,
    readonly open: boolean,
  ) {
    super();
  }
  get args() {
    return [this.pick, this.count, this.timer, this.open];
  }
  override check(model: Readonly<Model>): boolean {
    return activeFlows(realOf(model)).length > 0;
  }
  async run(model: Model, real: Real): Promise<void> {
    const flows = activeFlows(real);
    const parent = flows[this.pick % flows.length];
    const what = `${this.toString()} in ${parent.what}`;
    const { app } = parent;
    const key = parent.keys.length === 1 ? parent.keys[0] : parent.keys;
    const options = { acquireTimeout: 1_000 };
    const fork = (): Promise<void> => {
      const node = model.node(parent.node);
      const started = performance.now();
      return app.locks
        .using(
          key,
          async (lock) => {
            const held = model.granted(app, lock, node, DEFAULT_TTL, `${what} (fork)`);
            await new Promise((resolve) => setTimeout(resolve, 15));
            held.releasedAt ??= performance.now();
          },
          options,
        )
        .catch((error: unknown) => {
          if (!(error instanceof LockLostError)) {
            model.failed(`${what} (fork)`, error, app, {
              ms: performance.now() - started,
              timeout: options.acquireTimeout,
            });
          }
        });
    };
    const bound = options.acquireTimeout + 3 * model.commandTimeout;
    let child: Flow | undefined;
    await model.bounded(what, bound, () =>
      parent.run(async () => {
        if (this.timer) {
          const later = new Promise<void>((resolve) => setTimeout(() => resolve(fork()), 0));
          model.pending.push(model.bounded(`${what} (timer)`, bound, () => later));
        }
        if (this.open) {
          const flow = (child = new Flow(app, parent.keys, parent, model, `${what} (open fork)`));
          real.flows.push(flow);
          const started = performance.now();
          void flow.open(model, options, DEFAULT_TTL).then((error) => {
            if (
              error !== undefined &&
              flow.held === undefined &&
              !(error instanceof LockLostError)
            ) {
              model.failed(flow.what, error, app, {
                ms: performance.now() - started,
                timeout: options.acquireTimeout,
              });
            }
          });
        }
        await Promise.all(Array.from({ length: this.count }, fork));
      }),
    );
    const opened = child;
    if (opened) await model.bounded(`${what} (open fork)`, bound, () => opened.started);
    await model.check();
  }
}

/** Ends an open flow's body: its section releases (or its term ends, and the campaign goes on). */
class CloseFlowStep extends Step {
  readonly kind = 'close';
  constructor(readonly pick: number) {
    super();
  }
  get args() {
    return [this.pick];
  }
  override check(model: Readonly<Model>): boolean {
    return activeFlows(realOf(model)).length > 0;
  }
  async run(model: Model, real: Real): Promise<void> {
    const flows = activeFlows(real);
    const flow = flows[this.pick % flows.length];
    await closeFlow(model, flow, `${this.toString()}: ${flow.what}`);
    await model.check();
  }
}

async function closeFlow(model: Model, flow: Flow, what: string): Promise<void> {
  const error = await model.bounded(what, 2 * model.commandTimeout, () => flow.close());
  if (
    error instanceof Error &&
    !(error instanceof LockBackendError || error instanceof LockLostError)
  ) {
    model.violations.push(`${what}: the section ended with ${String(error)}`);
  }
}

/**
 * A scheduled job's fire: a `@WithLock` method with `onBusy: 'skip'`, on one key or both, with
 * or without `holdAtLeast`; its body is inside for `holdMs`.
 */
class JobStep extends Step {
  readonly kind = 'job';
  constructor(
    readonly slot: number,
    readonly keySet: number,
    readonly hold: boolean,
    readonly holdMs: number,
  ) {
    super();
  }
  get args() {
    return [this.slot, this.keySet, this.hold, this.holdMs];
  }
  async run(model: Model, real: Real): Promise<void> {
    const keys = KEY_SETS[this.keySet].map((i) => model.keys[i]);
    const app = real.apps[this.slot];
    const what = this.toString();
    const node = model.node(undefined);
    const holdAtLeast = keys.length > 1 ? 5_000 : this.hold ? 200 : 0;
    const body = async (): Promise<void> => {
      const held = model.granted(app, getCurrentLock()!, node, 10_000, what, 'plain', holdAtLeast);
      await new Promise((resolve) => setTimeout(resolve, this.holdMs));
      // The decorator releases it now.
      held.releasedAt ??= performance.now();
    };
    const fire = (): Promise<unknown> =>
      keys.length > 1
        ? app.jobs.both(keys[0], keys[1], body)
        : this.hold
          ? app.jobs.oneHeld(keys[0], body)
          : app.jobs.one(keys[0], body);
    model.pending.push(
      model
        .bounded(what, this.holdMs + 2 * model.commandTimeout * keys.length, fire)
        .catch((error: unknown) => model.failed(what, error, app)),
    );
    await new Promise((resolve) => setTimeout(resolve, 5));
    await model.check();
  }
}

/** Campaigns for leadership of k0 or k1; each term is a flow the steps can act in. */
class LeadStep extends Step {
  readonly kind = 'lead';
  constructor(
    readonly slot: number,
    readonly key: number,
  ) {
    super();
  }
  get args() {
    return [this.slot, this.key];
  }
  async run(model: Model, real: Real): Promise<void> {
    const app = real.apps[this.slot];
    const key = model.keys[this.key];
    const what = this.toString();
    const leader: Leader = {
      app,
      key,
      stopped: false,
      term: undefined,
      fences: [],
      leadership: app.locks.lead(
        key,
        async ({ signal, fence }) => {
          leader.fences.push(fence);
          const flow = new Flow(app, [key], undefined, model, `${what} term`, signal);
          real.flows.push(flow);
          leader.term = flow;
          flow.done = flow.body(model, getCurrentLock(key)!, 1_000);
          await flow.done;
          flow.ended = true;
        },
        { ttl: 1_000 },
      ),
    };
    // Told when stop() is first called, by a step or by the app's shutdown (which calls it too).
    const campaign = leader.leadership as unknown as { stop(...args: unknown[]): Promise<void> };
    const stop = campaign.stop.bind(campaign);
    campaign.stop = (...args) => {
      leader.stopCalledAt ??= performance.now();
      return stop(...args).then(() => {
        leader.stoppedAt ??= performance.now();
      });
    };
    real.leaders.push(leader);
    await new Promise((resolve) => setTimeout(resolve, 20));
    await model.check();
  }
}

/**
 * Stops a leadership: from outside, or from inside its current term's work (a leader stepping
 * down on its own), which must not wait for that work.
 */
class StopLeaderStep extends Step {
  readonly kind = 'stop';
  constructor(
    readonly pick: number,
    readonly inside: boolean,
  ) {
    super();
  }
  get args() {
    return [this.pick, this.inside];
  }
  override check(model: Readonly<Model>): boolean {
    return realOf(model).leaders.some((leader) => !leader.stopped && !leader.app.closing);
  }
  async run(model: Model, real: Real): Promise<void> {
    const leaders = real.leaders.filter((leader) => !leader.stopped && !leader.app.closing);
    const leader = leaders[this.pick % leaders.length];
    leader.stopped = true;
    const term = leader.term;
    const what = `${this.toString()}: ${leader.key}`;
    if (this.inside && term?.active) {
      // The term's lock is released as stop() is called (the work runs on): not when the body,
      // which awaits this call, returns (a release after the lease's end, if the stop is slow).
      if (term.held) term.held.releasedAt ??= performance.now();
      await model.bounded(what, 2 * model.commandTimeout, () =>
        term.run(() => leader.leadership.stop()),
      );
    } else {
      await stopLeader(model, leader, what);
    }
    await model.check();
  }
}

/**
 * Waits for a leadership's term with `elected({ timeout })`, while the steps go on: it resolves
 * only with a term the work was given, never after `stop()`, and while that term runs the
 * leadership leads; it rejects with `LeaderElectionTimeoutError` no earlier than its timeout and
 * only if `stop()` did not come first, or with `LeadershipStoppedError`; within its timeout,
 * whatever happens.
 */
class ElectedStep extends Step {
  readonly kind = 'elected';
  constructor(
    readonly pick: number,
    readonly timeout: number,
  ) {
    super();
  }
  get args() {
    return [this.pick, this.timeout];
  }
  override check(model: Readonly<Model>): boolean {
    return realOf(model).leaders.length > 0;
  }
  async run(model: Model, real: Real): Promise<void> {
    const leader = real.leaders[this.pick % real.leaders.length];
    const what = `${this.toString()}: ${leader.key}`;
    const started = performance.now();
    /** Whether stop() was called before `at` (by more than a timer's early firing). */
    const stoppedBefore = (at: number): boolean =>
      leader.stopCalledAt !== undefined && leader.stopCalledAt < at - 2;
    model.pending.push(
      model.bounded(what, this.timeout, () =>
        leader.leadership.elected({ timeout: this.timeout }).then(
          (term) => {
            if (term.key !== leader.key || !leader.fences.includes(term.fence)) {
              model.violations.push(
                `${what} resolved with a term its work was not given (fence ${term.fence}; terms ${leader.fences.join(', ')})`,
              );
            }
            if (!term.signal.aborted && !leader.leadership.isLeader) {
              model.violations.push(`${what} resolved with a running term while not leading`);
            }
            if (stoppedBefore(started)) model.violations.push(`${what} resolved after stop()`);
          },
          (error: unknown) => {
            const took = performance.now() - started;
            if (error instanceof LeaderElectionTimeoutError) {
              if (took < this.timeout - 1 || stoppedBefore(started + this.timeout)) {
                model.violations.push(
                  `${what} timed out after ${took.toFixed(0)} ms (stop() called ${leader.stopCalledAt === undefined ? 'never' : `at ${(leader.stopCalledAt - started).toFixed(0)} ms`}): ${error.message}`,
                );
              }
            } else if (!(error instanceof LeadershipStoppedError)) {
              model.violations.push(`${what} failed: ${String(error)}`);
            }
          },
        ),
      ),
    );
    await new Promise((resolve) => setTimeout(resolve, 5));
    await model.check();
  }
}

/**
 * `locks.leader(key)` read by any app, campaigning or not: it names nobody, or the term whose lock
 * holds the key as it reads, so never a term that no campaign's work was given, never under
 * another id, never one of a campaign whose `stop()` had resolved before the read, and never one
 * older than a term that had begun before the read.
 */
class WhoLeadsStep extends Step {
  readonly kind = 'leader';
  constructor(
    readonly pick: number,
    readonly slot: number,
  ) {
    super();
  }
  get args() {
    return [this.pick, this.slot];
  }
  override check(model: Readonly<Model>): boolean {
    return realOf(model).leaders.length > 0;
  }
  async run(model: Model, real: Real): Promise<void> {
    const { key } = real.leaders[this.pick % real.leaders.length];
    const app = real.apps[this.slot % real.apps.length];
    if (app.closing) return;
    const what = `${this.toString()}: ${key}`;
    const campaigns = real.leaders.filter((leader) => leader.key === key);
    const begun = Math.max(0, ...campaigns.flatMap(({ fences }) => fences));
    const readAt = performance.now();
    const info = await model.bounded(what, model.tryBound(app, 1, 2), () =>
      app.locks.leader(key).catch((error: unknown) => {
        // Redis failing (a fault step) or the app closing meanwhile: no answer to check.
        if (!(error instanceof LockBackendError || error instanceof RedisLockShutdownError)) {
          model.violations.push(`${what} failed: ${String(error)}`);
        }
        return null;
      }),
    );
    if (info) {
      const named = campaigns.find(({ fences }) => fences.includes(info.fence));
      if (!named) {
        model.violations.push(
          `${what} named term ${info.fence} (${info.id}), which no campaign's work was given`,
        );
      } else if (named.leadership.id !== info.id) {
        model.violations.push(
          `${what} named term ${info.fence} as ${info.id}'s; it is ${named.leadership.id}'s`,
        );
      }
      if (named?.stoppedAt !== undefined && named.stoppedAt < readAt) {
        model.violations.push(
          `${what} named term ${info.fence} of a campaign whose stop() had resolved before the read`,
        );
      }
      if (info.fence < begun) {
        model.violations.push(
          `${what} named term ${info.fence} after term ${begun} had begun: a deposed leader`,
        );
      }
    }
    await model.check();
  }
}

/**
 * An operator frees k0–k3 (whatever shape holds it) with `forceRelease()` from an app: the
 * holders it freed are no longer live, and each must be told (see `Model.checkFreedTold`).
 */
class ForceStep extends Step {
  readonly kind = 'force';
  constructor(
    readonly slot: number,
    readonly key: number,
  ) {
    super();
  }
  get args() {
    return [this.slot, this.key];
  }
  async run(model: Model, real: Real): Promise<void> {
    const app = real.apps[this.slot];
    if (app.closing) return;
    const key = model.keys[this.key];
    const what = this.toString();
    const force: Force = { key, from: performance.now() };
    model.forces.push(force);
    // The app's own holders of the key as the force is sent, but a lock passed on in the app whose
    // token write is on its way (that write is its check): the force checks each before it returns.
    const ownHolders = model.held.filter(
      (held) =>
        held.app === app &&
        !held.view &&
        held.keys.includes(key) &&
        held.releasedAt === undefined &&
        !(internals(held.lock).handleOf?.(key) ?? internals(held.lock)).swap,
    );
    // One script, then a check of the app's own holders of the key (one more round trip); in
    // Redlock mode each is bounded by two rounds.
    const rounds = model.deployment.shapes ? 2 : 4;
    await model.bounded(what, rounds * model.commandTimeout, () =>
      app.locks.forceRelease(key, { reason: what }).then(
        ({ holders, fence }) => {
          force.fence = fence;
          model.freed += holders;
        },
        (error: unknown) => {
          // Redis failing (a fault step; in Redlock mode, a majority not answering) or the app
          // closing meanwhile: it may have freed the key or not.
          if (!(error instanceof LockBackendError || error instanceof RedisLockShutdownError)) {
            model.violations.push(`${what} failed: ${String(error)}`);
          }
        },
      ),
    );
    force.until = performance.now();
    if (force.fence !== undefined) checkForcedOwnTold(model, force, ownHolders, what);
    if (force.fence !== undefined) {
      // Nothing it freed holds the key any more (a majority of nodes in Redlock mode), unless its
      // own token took the key again since.
      const owners = await real.deployment.owner(key);
      for (const held of model.held) {
        if (held.view || !held.keys.includes(key) || held.lock.fences[key] > force.fence) continue;
        const again = model.held.some(
          (other) => other.lock.token === held.lock.token && other.lock.fences[key] > force.fence!,
        );
        if (owners.includes(held.lock.token) && !again) {
          const perNode = real.deployment.perNode
            ? JSON.stringify(await real.deployment.perNode(key))
            : '';
          model.violations.push(
            `${what}: #${held.id} ${held.what} still holds ${key} in Redis (fence ${held.lock.fences[key]}, force ${force.fence}, token ${held.lock.token}, granted ${(held.grantedAt - force.from).toFixed(0)} ms after the force began, nodes ${perNode})`,
          );
        }
      }
    }
    await model.check();
  }
}

/**
 * The holders of the app that forced `force` (as it was sent) that it freed are told by the time
 * `forceRelease()` returns: it checks them with Redis before returning. Not asked where that check
 * may go unanswered (a slow link, a stalled machine, a force that itself took over half of
 * `commandTimeout`): a holder then learns at its next extension (see `Model.checkFreedTold`).
 */
function checkForcedOwnTold(model: Model, force: Force, holders: Held[], what: string): void {
  const slow =
    model.latencyMs > 0 ||
    model.stalls.stalled() > 100 ||
    force.until! - force.from > model.commandTimeout / 2;
  if (slow) return;
  for (const held of holders) {
    if (held.app.closing || held.releasedAt !== undefined || held.lock.signal.aborted) continue;
    if (held.lock.fences[force.key] > force.fence!) continue;
    // Its own token took the key again since: still held, by the same holder.
    const again = model.held.some(
      (other) =>
        other !== held &&
        !other.view &&
        other.lock.token === held.lock.token &&
        other.keys.includes(force.key) &&
        other.lock.fences[force.key] > force.fence!,
    );
    if (again) continue;
    model.violations.push(
      `${what}: #${held.id} ${held.what}, of the forcing app, freed (fence ${held.lock.fences[force.key]}, force ${force.fence}) and not told when forceRelease() returned`,
    );
  }
}

/** `stop()` from outside: the term's work (which ends at its signal) and one release, bounded. */
function stopLeader(model: Model, leader: Leader, what: string): Promise<unknown> {
  leader.stopped = true;
  return model.bounded(what, 4 * model.commandTimeout, () => leader.leadership.stop());
}

/**
 * Closes an app (and starts a new one in its slot): maybe with a release of one of its locks
 * made in the same tick, an attempt on its way, its link cut. Within twice `commandTimeout`,
 * whatever is in flight; afterwards, nothing of it is live and nothing it sent stays in Redis.
 */
class CloseAppStep extends Step {
  readonly kind = 'closeApp';
  constructor(
    readonly slot: number,
    readonly releasePick: number,
    /** How many keys an attempt on its way as the app closes names (0: none). */
    readonly attempt: 0 | 1 | 2,
    readonly stall: boolean,
  ) {
    super();
  }
  get args() {
    return [this.slot, this.releasePick, this.attempt, this.stall];
  }
  async run(model: Model, real: Real): Promise<void> {
    const app = real.apps[this.slot];
    const what = this.toString();
    // (Kept sequences written before it named the keys say `true` for one.)
    const attempted = Number(this.attempt);
    if (attempted > 0) {
      // One key, or both: a call on several keys sends one attempt on all of them first.
      const key = attempted === 1 ? model.keys[0] : model.keys.slice(0, 2);
      const node = model.node(undefined);
      model.pending.push(
        app.locks.tryAcquire(key, { ttl: 30_000 }).then(
          (lock) => lock && model.granted(app, lock, node, 30_000, `${what} (attempt)`),
          (error: unknown) => model.failed(`${what} (attempt)`, error, app),
        ),
      );
    }
    const stall = this.stall && this.slot === 0 && real.deployment.faults;
    if (stall) real.deployment.stall();
    const mine = model.held.filter((held) => held.app === app);
    // A live hold of this app, one that a waiter of this app waits for if there is one: its
    // release hands the lock over, in flight as the app closes.
    const holds = mine.filter((held) => !held.view && held.keys.every((k) => model.live(held, k)));
    const awaited = holds.filter((held) =>
      [...model.waiting].some((w) => w.app === app && w.keys.some((k) => held.keys.includes(k))),
    );
    const candidates = awaited.length > 0 ? awaited : holds;
    if (this.releasePick >= 0 && candidates.length > 0) {
      const held = candidates[this.releasePick % candidates.length];
      model.pending.push(release(model, held, `${what} (release)`));
    }
    // Shutdown releases every lock of the app: for a caller's own token, through every handle
    // of it (another app's too, see `Model.live`).
    model.appClosed = true;
    const closingAt = performance.now();
    for (const held of mine) held.releasedAt ??= closingAt;
    // On a cut link, what shutdown releases (or undoes) may get no answer: kept until its TTL.
    if (this.slot === 0 && real.deployment.stalled) {
      for (const held of mine) held.unconfirmed = true;
      model.leftBehind = true;
    }
    // Through a slow link after SCRIPT FLUSH, an attempt on its way (two round trips) may be
    // granted too late for its undo (two more) to fit in shutdown's one deadline: its lock expires
    // after its TTL (the README's shutdown bound). With the scripts there, it fits (a round trip
    // each, 300 ms at most here, in 2 × commandTimeout): nothing may stay.
    if (this.slot === 0 && attempted > 0 && model.latencyMs > 0 && model.scriptsFlushed) {
      model.leftBehind = true;
    }
    // One deadline (2 x commandTimeout) after the leaders' work, which here ends at its signal.
    await model.bounded(what, 2 * model.commandTimeout + 50, () => app.close(), 150);
    // An attempt whose reply did not come by shutdown's deadline (a link slower than
    // commandTimeout: on a Cluster, the first command to a master pays its connection's set-up
    // too): a grant it gets stays until its TTL, and shutdown says so.
    if (model.said('passed before Redis answered an abandoned attempt')) model.leftBehind = true;
    if (stall) real.deployment.heal();
    for (const leader of real.leaders) if (leader.app === app) leader.stopped = true;
    for (const flow of [...real.flows].reverse()) {
      if (flow.app === app && !flow.ended) await closeFlow(model, flow, `${what}: ${flow.what}`);
    }
    real.apps[this.slot] = await real.deployment.startApp(this.slot, ++real.generations);
    await model.check();
  }
}

/**
 * A crowd on one key in one app: a dozen callers wait at once (a listener per waiter would warn),
 * more than `maxWaiters` lets wait. `mixed`: on the read-write key, as many readers as may wait,
 * then writers (their attempts sent before the readers' answers came: refused by `maxWaiters`
 * after they queued their process, with only readers of it waiting).
 */
class CrowdStep extends Step {
  readonly kind = 'crowd';
  constructor(
    readonly slot: number,
    readonly key: number,
    readonly mixed = false,
  ) {
    super();
  }
  get args() {
    return this.mixed ? [this.slot, this.key, true] : [this.slot, this.key];
  }
  override check(model: Readonly<Model>): boolean {
    return !this.mixed || model.deployment.shapes;
  }
  async run(model: Model, real: Real): Promise<void> {
    const app = real.apps[this.slot];
    const key = model.keys[this.mixed ? 3 : this.key];
    const what = this.toString();
    const signal = new AbortController().signal; // shared by the crowd
    await Promise.all(
      Array.from({ length: 12 }, async (_, i) => {
        const node = model.node(undefined);
        const started = performance.now();
        const reads = this.mixed && i < MODEL_MAX_WAITERS.perKey;
        const options = {
          ttl: 1_000,
          acquireTimeout: 60,
          signal,
          ...(reads ? { mode: 'read' as const } : {}),
        };
        const lock = await model.bounded(what, 60 + 2 * model.commandTimeout, () =>
          app.locks.acquire(key, options).catch((error: unknown) => {
            model.failed(what, error, app, { ms: performance.now() - started, timeout: 60 });
            return null;
          }),
        );
        if (!lock) return;
        const held = model.granted(app, lock, node, 1_000, what, reads ? 'read' : 'plain');
        await release(model, held, `${what} (release)`);
      }),
    );
    await model.check();
  }
}

/** Every step, with its arguments drawn as fast-check arbitraries, and how often each comes. */
const STEPS: [fc.Arbitrary<Step>, number][] = [
  [
    fc
      .tuple(
        fc.integer({ min: 0, max: 1 }),
        fc.integer({ min: 0, max: KEY_SETS.length - 1 }),
        fc.constantFrom(...TTLS),
        fc.constantFrom('try' as const, 0 as const, 300 as const, 1_500 as const, 3_000 as const),
        fc.boolean(),
        fc.constantFrom(0, 0, 100, 5_000),
        fc.constantFrom(0, 0, 0, 20),
        fc.constantFrom(false, false, true),
      )
      .map((args) => new AcquireStep(...args)),
    4,
  ],
  [
    fc
      .tuple(fc.nat(), fc.boolean(), fc.constantFrom(false, false, true))
      .map((args) => new ReleaseStep(...args)),
    3,
  ],
  [fc.nat().map((pick) => new AbortStep(pick)), 1],
  [fc.tuple(fc.nat(), fc.constantFrom(150, 1_000)).map((args) => new ExtendStep(...args)), 1],
  [fc.constantFrom(10, 100, 320).map((ms) => new SleepStep(ms)), 2],
  [fc.constantFrom(0, 0, 150).map((ms) => new LatencyStep(ms)), 1],
  [fc.constantFrom(100, 400).map((ms) => new StallStep(ms)), 1],
  [
    fc
      .tuple(fc.constantFrom(false, true, 'acquire' as const), fc.boolean())
      .map((args) => new FlushScriptsStep(...args)),
    2,
  ],
  [fc.boolean().map((allowed) => new ChannelsStep(allowed)), 1],
  [
    fc
      .tuple(fc.nat({ max: 2 }), fc.constantFrom(100, 400))
      .map((args) => new PauseNodeStep(...args)),
    1,
  ],
  [fc.nat({ max: 2 }).map((node) => new RestartNodeStep(node)), 1],
  [
    fc
      .tuple(fc.nat({ max: 2 }), fc.constantFrom(1_000, 50_000, 1_000_000_000))
      .map((args) => new CounterAheadStep(...args)),
    1,
  ],
  [
    fc
      .tuple(fc.nat({ max: 2 }), fc.constantFrom(200, 1_000))
      .map((args) => new OutOfMemoryStep(...args)),
    1,
  ],
  [
    fc
      .tuple(
        fc.integer({ min: 0, max: 1 }),
        fc.integer({ min: 0, max: 1 }),
        fc.integer({ min: 0, max: 1 }),
        // (150 and 300: through a link slowed 150 ms each way, the grant comes after its lease.)
        fc.constantFrom(150, 300, 1_000, 30_000),
        fc.constantFrom(0 as const, 300 as const),
      )
      .map((args) => new AcquireOwnStep(...args)),
    2,
  ],
  [
    fc
      .tuple(
        fc.integer({ min: 0, max: 1 }),
        fc.integer({ min: 0, max: KEY_SETS.length - 1 }),
        fc.constantFrom(...TTLS),
        fc.constantFrom(true, true, false),
      )
      .map((args) => new OpenStep(...args)),
    3,
  ],
  [
    fc
      .tuple(
        fc.nat(),
        fc.constantFrom('using' as const, 'using' as const, 'acquire' as const),
        fc.constantFrom(0 as const, 300 as const),
      )
      .map((args) => new NestStep(...args)),
    4,
  ],
  [
    fc
      .tuple(fc.nat(), fc.integer({ min: 0, max: 3 }), fc.boolean(), fc.boolean())
      .map((args) => new ForkStep(...args)),
    3,
  ],
  [fc.nat().map((pick) => new CloseFlowStep(pick)), 3],
  [
    fc
      .tuple(
        fc.integer({ min: 0, max: 1 }),
        fc.integer({ min: 0, max: KEY_SETS.length - 1 }),
        fc.boolean(),
        fc.constantFrom(0, 50),
      )
      .map((args) => new JobStep(...args)),
    2,
  ],
  [
    fc
      .tuple(fc.integer({ min: 0, max: 1 }), fc.integer({ min: 0, max: 1 }))
      .map((args) => new LeadStep(...args)),
    1,
  ],
  [fc.tuple(fc.nat(), fc.boolean()).map((args) => new StopLeaderStep(...args)), 1],
  [fc.tuple(fc.nat(), fc.constantFrom(0, 200, 2_000)).map((args) => new ElectedStep(...args)), 1],
  [fc.tuple(fc.nat(), fc.nat()).map((args) => new WhoLeadsStep(...args)), 1],
  [
    fc
      .tuple(fc.integer({ min: 0, max: 1 }), fc.integer({ min: 0, max: 3 }))
      .map((args) => new ForceStep(...args)),
    Number(process.env.MODEL_FORCE_WEIGHT ?? 1),
  ],
  [
    fc
      .tuple(
        fc.integer({ min: 0, max: 1 }),
        fc.integer({ min: -1, max: 20 }),
        fc.constantFrom<0 | 1 | 2>(0, 1, 2),
        fc.boolean(),
      )
      .map((args) => new CloseAppStep(...args)),
    1,
  ],
  [
    fc
      .tuple(
        fc.integer({ min: 0, max: 1 }),
        fc.constantFrom('place' as const, 'read' as const, 'write' as const, 'fair' as const),
        fc.constantFrom(150, 1_000, 30_000),
        fc.constantFrom('try' as const, 300 as const),
        fc.constantFrom(0, 20),
      )
      .map((args) => new ShapeStep(...args)),
    3,
  ],
  [
    fc
      .tuple(fc.integer({ min: 0, max: 1 }), fc.integer({ min: 0, max: 1 }), fc.boolean())
      .map((args) => new CrowdStep(...args)),
    1,
  ],
];

/** The arbitrary of one step, each kind as often as its weight says. */
export const steps: fc.Arbitrary<Step>[] = STEPS.flatMap(([arbitrary, weight]) =>
  Array.from({ length: weight }, () => arbitrary),
);

/** Builds a step from its JSON (`toString()`), to replay a kept sequence. */
export function replay(json: readonly unknown[]): Step {
  const [kind, ...args] = json;
  const kinds: Record<string, new (...args: never[]) => Step> = {
    acquire: AcquireStep,
    shape: ShapeStep,
    release: ReleaseStep,
    extend: ExtendStep,
    sleep: SleepStep,
    latency: LatencyStep,
    stall: StallStep,
    flush: FlushScriptsStep,
    channels: ChannelsStep,
    open: OpenStep,
    nest: NestStep,
    fork: ForkStep,
    close: CloseFlowStep,
    job: JobStep,
    lead: LeadStep,
    stop: StopLeaderStep,
    elected: ElectedStep,
    leader: WhoLeadsStep,
    force: ForceStep,
    closeApp: CloseAppStep,
    crowd: CrowdStep,
    own: AcquireOwnStep,
    abort: AbortStep,
    pause: PauseNodeStep,
    restart: RestartNodeStep,
    ahead: CounterAheadStep,
    oom: OutOfMemoryStep,
  };
  const step = kinds[kind as string];
  if (!step) throw new Error(`no model step "${String(kind)}"`);
  return Reflect.construct(step, args) as Step;
}

/**
 * Ends a sequence: leaderships stopped, flows closed, every call settled; then nothing may be in
 * Redis without a live holder; then every lock released, and nothing left at all.
 */
export async function settle(model: Model, real: Real): Promise<void> {
  real.deployment.latency(0);
  real.deployment.heal();
  await real.deployment.channels(true);
  for (const leader of real.leaders) {
    if (!leader.stopped) await stopLeader(model, leader, `settle: stop ${leader.key}`);
  }
  for (const flow of [...real.flows].reverse()) {
    if (!flow.ended) await closeFlow(model, flow, `settle: close ${flow.what}`);
  }
  await Promise.all(model.pending);
  model.checkHolders('once settled');
  await model.checkNothingKept('once settled');
  for (const held of model.held) {
    if (!held.app.closing && held.releases === 0)
      await release(model, held, `settle: release #${held.id}`);
  }
  await model.checkNothingKept('after every release');
  await model.checkNothingQueued('after every release');
  for (const app of real.apps) {
    await model.bounded(`settle: close app ${app.slot}`, 2 * model.commandTimeout + 50, () =>
      app.close(),
    );
  }
  model.assertClean();
}
