import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import fc from 'fast-check';
import { Redis } from 'ioredis';
import {
  LockAcquireTimeoutError,
  LockBackendError,
  LockLostError,
  type Lock,
  type LockService,
} from '../../lib/index.js';
import { startLockModule, uniqueKey, type LockModuleFixture } from '../support/lock-module.js';
import { FaultProxy } from '../support/fault-proxy.js';
import { startRedis, type RedisServer } from '../support/redis-server.js';
import { SLACK_MS, watchStalls } from '../support/timing.js';

/**
 * Model-based tests of the engine (fast-check `commands`): random sequences of acquire,
 * tryAcquire, waiters left waiting, release (also twice), extend, re-entry from inside a held
 * section, several keys, semaphore places, read and write locks, TTLs from 50 ms to 30 s, in two
 * apps, one of them behind a proxy whose latency changes and which partitions it for a while,
 * against a real Redis. The model is who holds what; after every step and at every grant the
 * invariants are checked, against the handles and against Redis itself:
 *
 * - never two live holders of one key where one excludes the other (live: not released, `signal`
 *   not aborted, lease not over); never more places than the semaphore's limit;
 * - counting views: calls forked inside a section (side by side, or from a timer that may outlive
 *   it) are never inside the key at once while both are live, be it through a view of the
 *   section's hold or a lock of their own; a view is never live once its hold is not;
 * - a grant never comes with its lease over, nor with a lease longer than its own TTL;
 * - fences of exclusive holders grow strictly per key, in the order grants are seen (those of
 *   places and read locks, which overlap, are unique);
 * - a live holder's key holds its token in Redis (unless its own write is still on its way);
 * - no lock key nor fence counter without a TTL; a second release answers `false`;
 * - every call settles within its documented bound; after every release nothing is left.
 *
 * `MODEL_RUNS` (default 15) sequences of up to `MODEL_STEPS` (default 40) steps; `MODEL_SEED`
 * replays one (fast-check prints the seed and the shrunk sequence of a failure).
 */
const RUNS = Number(process.env.MODEL_RUNS ?? 15);
const STEPS = Number(process.env.MODEL_STEPS ?? 40);
const SEED = process.env.MODEL_SEED === undefined ? undefined : Number(process.env.MODEL_SEED);
const COMMAND_TIMEOUT = 2_000;
/** The module's default TTL (a nested call leaves it out: it re-enters, or takes the key afresh). */
const DEFAULT_TTL = 10_000;

/** Internals the invariants read (not part of the API). */
interface Internals {
  readonly released: boolean;
  /** Of a hold: the view a call nested in its flow has open, if any. */
  readonly inner?: Internals;
  readonly swap?: unknown;
  handleOf?(key: string): Internals | undefined;
}
const internals = (lock: Lock): Internals => lock as unknown as Internals;

/** What a holder holds: the plain lock (a writer), a place of SEMAPHORE_LIMIT, or a read lock. */
type Shape = 'plain' | 'place' | 'read';
const SEMAPHORE_LIMIT = 2;

interface Held {
  readonly id: number;
  readonly app: number;
  readonly lock: Lock;
  readonly shape: Shape;
  /** A re-entry from inside a section: a view of that section's lock. */
  readonly view: boolean;
  /** Of a view: the section's hold it is a view of. */
  readonly outer?: Held;
  /** When the model saw it granted (`performance.now()`). */
  readonly grantedAt: number;
  releases: number;
}

/** A `using()` section whose body runs what the test sends it, inside the section's call chain. */
class Section {
  outer: Lock | undefined;
  private readonly queue: (() => Promise<void>)[] = [];
  private wake: (() => void) | undefined;
  private closing = false;
  readonly started: Promise<boolean>;
  readonly done: Promise<unknown>;

  constructor(locks: LockService, key: string, ttl: number) {
    let opened!: (ok: boolean) => void;
    this.started = new Promise((resolve) => (opened = resolve));
    this.done = locks
      .using(
        key,
        async (lock) => {
          this.outer = lock;
          opened(true);
          for (;;) {
            const next = this.queue.shift();
            if (next) await next();
            else if (this.closing) return;
            else await new Promise<void>((resolve) => (this.wake = resolve));
          }
        },
        { ttl, acquireTimeout: 0 },
      )
      .then(
        () => undefined,
        (error: unknown) => {
          opened(false);
          return error;
        },
      );
  }

  get open(): boolean {
    return this.outer !== undefined && !this.closing;
  }

  /** Runs `fn` inside the section, in its call chain. */
  run<T>(fn: () => Promise<T>): Promise<T> {
    return new Promise<T>((resolve, reject) => {
      this.queue.push(() => fn().then(resolve, reject));
      this.wake?.();
    });
  }

  async close(): Promise<unknown> {
    this.closing = true;
    this.wake?.();
    return this.done;
  }
}

interface Model {
  /** k0, k1: plain locks (one key or both); k2: a semaphore; k3: read and write locks. */
  readonly keys: readonly string[];
  readonly held: Held[];
  readonly sections: Section[];
  readonly pending: Promise<void>[];
  /** Per key, the highest fence granted so far. */
  readonly fences: Map<string, number>;
  readonly violations: string[];
  /** The locks (views or their own) that forked calls are inside right now. */
  readonly inside: Set<Lock>;
  /** Forked calls that ran inside a view of their section's hold. */
  forkedViews: number;
  nextId: number;
}

interface Real {
  readonly apps: readonly LockService[];
  readonly redis: Redis;
  readonly proxy: FaultProxy;
  readonly stalls: { stalled(): number };
}

const live = (held: Held, now: number): boolean =>
  !internals(held.lock).released && !held.lock.signal.aborted && held.lock.expiresAt > now;

/** Whether `a` and `b`, both live on one key, may hold it at once. */
const compatible = (a: Shape, b: Shape): boolean =>
  (a === 'place' && b === 'place') || (a === 'read' && b === 'read');

/** A lock was granted: checks it against every holder the model knows, then records it. */
function granted(
  model: Model,
  app: number,
  lock: Lock,
  ttl: number,
  view: boolean,
  shape: Shape = 'plain',
  outer?: Held,
): void {
  const now = performance.now();
  const name = `${view ? 'view' : shape} of ${lock.keys.join('+')} (app ${app}, fence ${lock.fence})`;
  if (!view) {
    if (lock.expiresAt < now - 1) {
      model.violations.push(
        `${name} granted ${(now - lock.expiresAt).toFixed(1)} ms after its lease ran out`,
      );
    }
    if (lock.expiresAt - now > ttl) {
      model.violations.push(
        `${name} believes for ${(lock.expiresAt - now).toFixed(0)} ms, over its TTL of ${ttl}`,
      );
    }
    for (const key of lock.keys) {
      const others = model.held.filter(
        (other) =>
          !other.view &&
          other.lock.token !== lock.token &&
          other.lock.keys.includes(key) &&
          live(other, now),
      );
      const excluding = others.filter((other) => !compatible(shape, other.shape));
      if (excluding.length > 0) {
        model.violations.push(
          `${name} granted while ${excluding.map((other) => `${other.shape} fence ${other.lock.fences[key]} (app ${other.app})`).join(', ')} held ${key} too`,
        );
      }
      if (shape === 'place' && others.length >= SEMAPHORE_LIMIT) {
        model.violations.push(
          `${name}: ${others.length + 1} live places of limit ${SEMAPHORE_LIMIT}`,
        );
      }
      // Exclusive holders follow one another, so their fences rise in the order seen; places and
      // read locks overlap, and one app's grant may be seen after a later one of the other's:
      // their fences are only unique.
      const fence = lock.fences[key];
      const last = model.fences.get(key) ?? 0;
      if (shape === 'plain' && fence <= last) {
        model.violations.push(`${name}: fence ${fence} of ${key} not above ${last}`);
      }
      if (
        shape !== 'plain' &&
        model.held.some((other) => !other.view && other.lock.fences[key] === fence)
      ) {
        model.violations.push(`${name}: fence ${fence} of ${key} given twice`);
      }
      model.fences.set(key, Math.max(fence, last));
    }
  }
  model.held.push({
    id: model.nextId++,
    app,
    lock,
    shape,
    view,
    outer,
    grantedAt: now,
    releases: 0,
  });
}

/** An acquisition that failed: only the documented errors. */
function failed(model: Model, what: string, error: unknown): void {
  if (!(error instanceof LockAcquireTimeoutError || error instanceof LockBackendError)) {
    model.violations.push(`${what} failed with ${String(error)}`);
  }
}

/** The invariants that hold between steps, checked against Redis. */
async function checkState(model: Model, real: Real): Promise<void> {
  // Redis first: a holder granted before the read and live after it was live during it (a lease
  // only runs out; an extension confirmed later was sent while the lease ran).
  const readAt = performance.now();
  const names = [...model.keys.map((key) => `lock:{${key}}`), 'lock:{}:counter'];
  const plainKeys = model.keys.slice(0, 2);
  const [values, pttls] = await Promise.all([
    real.redis.mget(...plainKeys.map((key) => `lock:{${key}}`)),
    Promise.all(names.map((name) => real.redis.pttl(name))),
  ]);
  names.forEach((name, i) => {
    if (pttls[i] === -1) model.violations.push(`${name} has no TTL`);
  });
  const now = performance.now();
  model.keys.forEach((key, i) => {
    const holders = model.held.filter(
      (held) => !held.view && held.lock.keys.includes(key) && live(held, now),
    );
    const owners = new Set(holders.map((held) => held.lock.token));
    const places = holders.filter((held) => held.shape === 'place').length;
    const writers = holders.filter((held) => held.shape === 'plain').length;
    const readers = holders.filter((held) => held.shape === 'read').length;
    if (places > SEMAPHORE_LIMIT) model.violations.push(`${places} live places of ${key}`);
    if (writers > 1 || (writers > 0 && owners.size > 1)) {
      model.violations.push(
        `${owners.size} live holders of ${key} (${writers} writers, ${readers} readers)`,
      );
    }
    if (i >= plainKeys.length) return;
    for (const held of holders) {
      if (held.grantedAt >= readAt) continue;
      const handle = internals(held.lock).handleOf?.(key) ?? internals(held.lock);
      if (handle.swap === undefined && values[i] !== held.lock.token) {
        model.violations.push(
          `live holder of ${key} (fence ${held.lock.fences[key]}, app ${held.app}) not the owner in Redis (${values[i]})`,
        );
      }
    }
  });
  for (const held of model.held) {
    if (held.outer && live(held, now) && !live(held.outer, now)) {
      model.violations.push(
        `a view of ${held.lock.key} (fence ${held.lock.fence}) live after its hold ended`,
      );
    }
  }
  if (model.violations.length > 0) assert.fail(model.violations.join('\n'));
}

/** Runs one call, checking it settles within `bound` ms (plus what a loaded machine adds). */
async function bounded<T>(
  real: Real,
  model: Model,
  what: string,
  bound: number,
  call: () => Promise<T>,
): Promise<T> {
  const started = performance.now();
  try {
    return await call();
  } finally {
    const took = performance.now() - started;
    const limit = bound + SLACK_MS + real.stalls.stalled();
    if (took > limit)
      model.violations.push(`${what} took ${took.toFixed(0)} ms, over its bound ${bound}`);
  }
}

const KEY_SETS = [[0], [1], [0, 1]] as const;
const TTLS = [50, 150, 300, 1_000, 30_000] as const;

class AcquireCommand implements fc.AsyncCommand<Model, Real> {
  constructor(
    readonly app: number,
    readonly keySet: number,
    readonly ttl: number,
    readonly wait: 'try' | 0 | 300 | 1_500,
    readonly autoExtend: boolean,
  ) {}
  check = (): boolean => true;
  async run(model: Model, real: Real): Promise<void> {
    const keys = KEY_SETS[this.keySet].map((i) => model.keys[i]);
    const key = keys.length === 1 ? keys[0] : keys;
    const locks = real.apps[this.app];
    const options = { ttl: this.ttl, autoExtend: this.autoExtend };
    const what = this.toString();
    if (this.wait === 'try') {
      const lock = await bounded(real, model, what, COMMAND_TIMEOUT * keys.length, () =>
        locks
          .tryAcquire(key, options)
          .catch((error: unknown) => (failed(model, what, error), null)),
      );
      if (lock) granted(model, this.app, lock, this.ttl, false);
    } else {
      const acquireTimeout = this.wait;
      const call = bounded(real, model, what, acquireTimeout + COMMAND_TIMEOUT * keys.length, () =>
        locks.acquire(key, { ...options, acquireTimeout }),
      ).then(
        (lock) => granted(model, this.app, lock, this.ttl, false),
        (error: unknown) => failed(model, what, error),
      );
      // A wait is left running (a waiter, in its app's queue); an attempt is awaited.
      if (acquireTimeout > 0) model.pending.push(call);
      else await call;
    }
    await checkState(model, real);
  }
  toString = (): string =>
    `acquire(app ${this.app}, k${KEY_SETS[this.keySet].join('+k')}, ttl ${this.ttl}, ${this.wait}${this.autoExtend ? ', autoExtend' : ''})`;
}

/** A place in the semaphore (k2), or a read or write lock (k3). */
class ShapeCommand implements fc.AsyncCommand<Model, Real> {
  constructor(
    readonly app: number,
    readonly shape: 'place' | 'read' | 'write',
    readonly ttl: number,
    readonly wait: 'try' | 300,
  ) {}
  check = (): boolean => true;
  async run(model: Model, real: Real): Promise<void> {
    const key = model.keys[this.shape === 'place' ? 2 : 3];
    const options =
      this.shape === 'place'
        ? { ttl: this.ttl, limit: SEMAPHORE_LIMIT }
        : { ttl: this.ttl, mode: this.shape };
    const shape: Shape = this.shape === 'write' ? 'plain' : this.shape;
    const locks = real.apps[this.app];
    const what = this.toString();
    if (this.wait === 'try') {
      const lock = await bounded(real, model, what, COMMAND_TIMEOUT, () =>
        locks
          .tryAcquire(key, options)
          .catch((error: unknown) => (failed(model, what, error), null)),
      );
      if (lock) granted(model, this.app, lock, this.ttl, false, shape);
    } else {
      const acquireTimeout = this.wait;
      model.pending.push(
        bounded(real, model, what, acquireTimeout + COMMAND_TIMEOUT, () =>
          locks.acquire(key, { ...options, acquireTimeout }),
        ).then(
          (lock) => granted(model, this.app, lock, this.ttl, false, shape),
          (error: unknown) => failed(model, what, error),
        ),
      );
    }
    await checkState(model, real);
  }
  toString = (): string =>
    `${this.shape === 'place' ? `acquire(limit ${SEMAPHORE_LIMIT}` : `acquire(mode ${this.shape}`}, app ${this.app}, ttl ${this.ttl}, ${this.wait})`;
}

/** A partition of app 0 from Redis: nothing crosses for `ms`, then everything sent arrives. */
class StallCommand implements fc.AsyncCommand<Model, Real> {
  constructor(readonly ms: number) {}
  check = (): boolean => true;
  async run(model: Model, real: Real): Promise<void> {
    real.proxy.stall();
    await new Promise((resolve) => setTimeout(resolve, this.ms));
    real.proxy.heal();
    await checkState(model, real);
  }
  toString = (): string => `stall(app 0, ${this.ms} ms)`;
}

class ReleaseCommand implements fc.AsyncCommand<Model, Real> {
  constructor(
    readonly pick: number,
    readonly twice: boolean,
  ) {}
  check = (model: Readonly<Model>): boolean => model.held.length > 0;
  async run(model: Model, real: Real): Promise<void> {
    const held = model.held[this.pick % model.held.length];
    const times = this.twice ? 2 : 1;
    for (let i = 0; i < times; i++) {
      const answer = await bounded(real, model, this.toString(), COMMAND_TIMEOUT, () =>
        held.lock.release().catch((error: unknown) => error),
      );
      if (answer instanceof Error && !(answer instanceof LockBackendError)) {
        model.violations.push(`release of #${held.id} failed with ${String(answer)}`);
      }
      if (held.releases++ > 0 && answer !== false) {
        model.violations.push(
          `release ${held.releases} of #${held.id} (${held.view ? 'a view' : 'a lock'}) answered ${String(answer)}`,
        );
      }
    }
    await checkState(model, real);
  }
  toString = (): string => `release(#${this.pick}${this.twice ? ', twice' : ''})`;
}

class ExtendCommand implements fc.AsyncCommand<Model, Real> {
  constructor(
    readonly pick: number,
    readonly ttl: number,
  ) {}
  check = (model: Readonly<Model>): boolean => model.held.length > 0;
  async run(model: Model, real: Real): Promise<void> {
    const held = model.held[this.pick % model.held.length];
    await bounded(real, model, this.toString(), 2 * COMMAND_TIMEOUT, () =>
      held.lock.extend(this.ttl).catch((error: unknown) => {
        if (!(error instanceof LockLostError || error instanceof LockBackendError)) {
          model.violations.push(`extend of #${held.id} failed with ${String(error)}`);
        }
      }),
    );
    await checkState(model, real);
  }
  toString = (): string => `extend(#${this.pick}, ${this.ttl})`;
}

class SleepCommand implements fc.AsyncCommand<Model, Real> {
  constructor(readonly ms: number) {}
  check = (): boolean => true;
  async run(model: Model, real: Real): Promise<void> {
    await new Promise((resolve) => setTimeout(resolve, this.ms));
    await checkState(model, real);
  }
  toString = (): string => `sleep(${this.ms})`;
}

class LatencyCommand implements fc.AsyncCommand<Model, Real> {
  constructor(readonly ms: number) {}
  check = (): boolean => true;
  async run(model: Model, real: Real): Promise<void> {
    real.proxy.setLatency(this.ms);
    await checkState(model, real);
  }
  toString = (): string => `latency(app 0, ${this.ms} ms each way)`;
}

class OpenCommand implements fc.AsyncCommand<Model, Real> {
  constructor(
    readonly app: number,
    readonly key: number,
    readonly ttl: number,
  ) {}
  check = (): boolean => true;
  async run(model: Model, real: Real): Promise<void> {
    const section = new Section(real.apps[this.app], model.keys[this.key], this.ttl);
    if (await bounded(real, model, this.toString(), COMMAND_TIMEOUT, () => section.started)) {
      model.sections.push(section);
      granted(model, this.app, section.outer!, this.ttl, false);
    } else {
      failed(model, this.toString(), await section.done);
    }
    await checkState(model, real);
  }
  toString = (): string => `using(app ${this.app}, k${this.key}, ttl ${this.ttl}) {`;
}

/** The open section `pick` chooses, the model's record of its hold, and that hold's app and key. */
function openSection(
  model: Model,
  real: Real,
  pick: number,
): { section: Section; outer: Held; service: LockService; key: string } {
  const open = model.sections.filter((section) => section.open);
  const section = open[pick % open.length];
  const outer = model.held.find((held) => held.lock === section.outer)!;
  return { section, outer, service: real.apps[outer.app], key: outer.lock.key };
}

class NestedCommand implements fc.AsyncCommand<Model, Real> {
  constructor(
    readonly pick: number,
    readonly how: 'acquire' | 'using',
    /** How deep `using()` calls nest in each other (each re-enters the section's hold). */
    readonly depth = 1,
  ) {}
  check = (model: Readonly<Model>): boolean => model.sections.some((section) => section.open);
  async run(model: Model, real: Real): Promise<void> {
    const { section, outer, service, key } = openSection(model, real, this.pick);
    // Without waiting: the section's own lock is re-entered at once; once it was released (a
    // release step), the call is a new one, as from anywhere else.
    const options = { acquireTimeout: 0 };
    await bounded(real, model, this.toString(), COMMAND_TIMEOUT, () =>
      section
        .run(async () => {
          const wasLive = live(outer, performance.now());
          // A view of the section's hold left open (a forgotten nested acquire(), a forked call
          // still inside) makes a nested call wait its turn; with none, straight nesting never
          // waits. Read from the hold itself, in the same synchronous step as the call's re-entry.
          const open = internals(outer.lock).inner;
          const taken = open !== undefined && !open.released;
          if (this.how === 'acquire') {
            const lock = await service.acquire(key, options);
            const view = lock.token === outer.lock.token;
            if (wasLive && !view) {
              model.violations.push(
                `a nested acquire() of ${key} got a lock of its own, not a re-entry`,
              );
            }
            granted(model, outer.app, lock, 10_000, view, 'plain', view ? outer : undefined);
          } else {
            const nest = (level: number): Promise<void> =>
              service.using(
                key,
                async (inner) => {
                  if (wasLive && inner.token !== outer.lock.token) {
                    model.violations.push(
                      `a nested using() of ${key} (depth ${level}) got a lock of its own, not a re-entry`,
                    );
                  }
                  if (level < this.depth) await nest(level + 1);
                },
                options,
              );
            await nest(1).catch((error: unknown) => {
              if (error instanceof LockAcquireTimeoutError && wasLive && !taken) {
                model.violations.push(`straight nesting of ${key} waited: ${String(error)}`);
              }
              throw error;
            });
          }
        })
        .catch((error: unknown) => {
          if (!(error instanceof LockLostError)) failed(model, this.toString(), error);
        }),
    );
    await checkState(model, real);
  }
  toString = (): string =>
    `  nested ${this.how}${this.how === 'using' && this.depth > 1 ? ` x${this.depth}` : ''}(section #${this.pick})`;
}

/**
 * Calls forked inside a section: `count` nested `using()` run side by side, and maybe one more
 * from a timer that the section does not wait for (it may run after the section ended). Each is
 * inside for a while; none may be inside while another live one is (counting views).
 */
class ForkCommand implements fc.AsyncCommand<Model, Real> {
  constructor(
    readonly pick: number,
    readonly count: number,
    readonly timer: boolean,
  ) {}
  check = (model: Readonly<Model>): boolean => model.sections.some((section) => section.open);
  async run(model: Model, real: Real): Promise<void> {
    const { section, outer, service, key } = openSection(model, real, this.pick);
    const fork = (): Promise<void> =>
      service
        .using(
          key,
          async (lock) => {
            const view = lock.token === outer.lock.token;
            // A fork that found the hold ended took the key afresh: a grant like any other.
            if (!view) granted(model, outer.app, lock, DEFAULT_TTL, false);
            else model.forkedViews++;
            const now = performance.now();
            for (const other of model.inside) {
              if (other.key === key && live(holderOf(model, other), now)) {
                model.violations.push(
                  `two forked calls inside ${key} at once (fences ${other.fence} and ${lock.fence})`,
                );
              }
            }
            model.inside.add(lock);
            await new Promise((resolve) => setTimeout(resolve, 15));
            model.inside.delete(lock);
          },
          { acquireTimeout: 1_000 },
        )
        .catch((error: unknown) => {
          if (!(error instanceof LockLostError)) failed(model, this.toString(), error);
        });
    await bounded(real, model, this.toString(), 3 * COMMAND_TIMEOUT, () =>
      section.run(async () => {
        if (this.timer) {
          const later = new Promise<void>((resolve) => setTimeout(() => resolve(fork()), 0));
          model.pending.push(later);
        }
        await Promise.all(Array.from({ length: this.count }, fork));
      }),
    );
    await checkState(model, real);
  }
  toString = (): string =>
    `  fork ${this.count} using()${this.timer ? ' + a timer' : ''} (section #${this.pick})`;
}

/** The model's record of `lock`, or (a view it did not record) one to judge its liveness by. */
function holderOf(model: Model, lock: Lock): Held {
  return (
    model.held.find((held) => held.lock === lock) ?? {
      id: -1,
      app: -1,
      lock,
      shape: 'plain',
      view: true,
      grantedAt: 0,
      releases: 0,
    }
  );
}

class CloseCommand implements fc.AsyncCommand<Model, Real> {
  constructor(readonly pick: number) {}
  check = (model: Readonly<Model>): boolean => model.sections.some((section) => section.open);
  async run(model: Model, real: Real): Promise<void> {
    const open = model.sections.filter((section) => section.open);
    const section = open[this.pick % open.length];
    const error = await bounded(real, model, this.toString(), COMMAND_TIMEOUT, () =>
      section.close(),
    );
    if (error instanceof Error) model.violations.push(`a section ended with ${error.message}`);
    await checkState(model, real);
  }
  toString = (): string => `} (section #${this.pick})`;
}

const commandKinds = [
  fc
    .tuple(
      fc.integer({ min: 0, max: 1 }),
      fc.integer({ min: 0, max: KEY_SETS.length - 1 }),
      fc.constantFrom(...TTLS),
      fc.constantFrom('try' as const, 0 as const, 300 as const, 1_500 as const),
      fc.boolean(),
    )
    .map(
      ([app, keys, ttl, wait, autoExtend]) => new AcquireCommand(app, keys, ttl, wait, autoExtend),
    ),
  fc.tuple(fc.nat(), fc.boolean()).map(([pick, twice]) => new ReleaseCommand(pick, twice)),
  fc
    .tuple(fc.nat(), fc.constantFrom(150, 1_000))
    .map(([pick, ttl]) => new ExtendCommand(pick, ttl)),
  fc.constantFrom(10, 100, 320).map((ms) => new SleepCommand(ms)),
  fc.constantFrom(0, 0, 150).map((ms) => new LatencyCommand(ms)),
  fc
    .tuple(fc.integer({ min: 0, max: 1 }), fc.integer({ min: 0, max: 1 }), fc.constantFrom(...TTLS))
    .map(([app, key, ttl]) => new OpenCommand(app, key, ttl)),
  fc
    .tuple(
      fc.nat(),
      fc.constantFrom('acquire' as const, 'using' as const),
      fc.integer({ min: 1, max: 3 }),
    )
    .map(([pick, how, depth]) => new NestedCommand(pick, how, depth)),
  fc.nat().map((pick) => new CloseCommand(pick)),
  fc
    .tuple(
      fc.integer({ min: 0, max: 1 }),
      fc.constantFrom('place' as const, 'read' as const, 'write' as const),
      fc.constantFrom(150, 1_000, 30_000),
      fc.constantFrom('try' as const, 300 as const),
    )
    .map(([app, shape, ttl, wait]) => new ShapeCommand(app, shape, ttl, wait)),
  fc.constantFrom(100, 400).map((ms) => new StallCommand(ms)),
  fc
    .tuple(fc.nat(), fc.integer({ min: 2, max: 3 }), fc.boolean())
    .map(([pick, count, timer]) => new ForkCommand(pick, count, timer)),
];
/**
 * How often each kind comes, in order: acquire, release, extend, sleep, latency, using, nested,
 * close, shapes, stall, fork.
 */
const WEIGHTS = [4, 3, 1, 2, 1, 2, 3, 1, 3, 1, 2];
const commands = commandKinds.flatMap((kind, i) => Array.from({ length: WEIGHTS[i] }, () => kind));

describe('the engine against a model of the lock (fast-check)', () => {
  let server: RedisServer;
  let proxy: FaultProxy;
  let apps: LockModuleFixture[];
  let redis: Redis;

  before(async () => {
    server = await startRedis();
    proxy = await FaultProxy.start(() => server.port);
    apps = [
      await startLockModule({
        connection: `redis://127.0.0.1:${proxy.port}`,
        commandTimeout: COMMAND_TIMEOUT,
      }),
      await startLockModule({ connection: server.url, commandTimeout: COMMAND_TIMEOUT }),
    ];
    redis = new Redis(server.port, '127.0.0.1');
  });
  after(async () => {
    proxy?.setLatency(0);
    for (const app of apps ?? []) await app.close();
    redis?.disconnect();
    await proxy?.close();
    await server?.stop();
  });

  it(`never two live holders, fences rising, nothing left: ${RUNS} random sequences of up to ${STEPS} steps`, async (t) => {
    const stalls = watchStalls();
    const totals = { sequences: 0, steps: 0, grants: 0, views: 0, forked: 0 };
    try {
      await fc.assert(
        fc.asyncProperty(
          fc.commands(commands, { maxCommands: STEPS, size: 'max' }),
          async (sequence) => {
            const run = uniqueKey('model');
            const model: Model = {
              keys: [0, 1, 2, 3].map((i) => `${run}:k${i}`),
              held: [],
              sections: [],
              pending: [],
              fences: new Map(),
              violations: [],
              inside: new Set(),
              forkedViews: 0,
              nextId: 0,
            };
            const real: Real = { apps: apps.map((app) => app.locks), redis, proxy, stalls };
            try {
              await fc.asyncModelRun(() => ({ model, real }), sequence);
            } finally {
              await settle(model, real);
              totals.sequences++;
              totals.steps += [...sequence].length;
              totals.grants += model.held.filter((held) => !held.view).length;
              totals.views += model.held.filter((held) => held.view).length;
              totals.forked += model.forkedViews;
            }
          },
        ),
        {
          numRuns: RUNS,
          seed: SEED,
          endOnFailure: process.env.MODEL_SHRINK === '0',
          includeErrorInReport: true,
        },
      );
    } finally {
      stalls.stop();
      t.diagnostic(
        `${totals.sequences} sequences (shrinking included), ${totals.steps} steps, ${totals.grants} locks granted, ${totals.views} re-entries, ${totals.forked} forked calls inside a view`,
      );
    }
  });

  /** Ends a sequence: every section closed, every waiter settled, every lock released, nothing left. */
  async function settle(model: Model, real: Real): Promise<void> {
    real.proxy.setLatency(0);
    for (const section of model.sections) await section.close();
    await Promise.all(model.pending);
    await Promise.all(model.held.map((held) => held.lock.release().catch(() => false)));
    const names = model.keys.map((key) => `lock:{${key}}`);
    const deadline = performance.now() + 3_000;
    while ((await real.redis.exists(...names)) > 0 && performance.now() < deadline) {
      await new Promise((resolve) => setTimeout(resolve, 20));
    }
    const left = await real.redis.exists(...names);
    if (left > 0) model.violations.push(`${left} lock key(s) left after every release`);
    if (model.violations.length > 0) assert.fail(model.violations.join('\n'));
  }
});
