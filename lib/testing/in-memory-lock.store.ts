import type {
  Election,
  Freed,
  Inspection,
  LockShape,
} from '../interfaces/lock-backend.interface.js';

/** Holders of a key that several may hold: token → when its lease ends (`performance.now()`). */
type Holders = Map<string, number>;

/** What holds a key: the shapes of `lock.scripts.ts` and `shape.scripts.ts`, as objects. */
type Entry =
  | { readonly kind: 'exclusive'; token: string; expiresAt: number }
  | { readonly kind: 'semaphore'; readonly holders: Holders }
  /** Read locks, and the mark of a waiting writer (`MARK_WRITER`): no new reader joins while it lives. */
  | { readonly kind: 'read'; readonly holders: Holders; mark: number | undefined };

/** One key of the store: who holds it, its fences, its fair queue and its election. */
interface KeyState {
  entry: Entry | undefined;
  /** The last fence given on this key (its fence counter: it never expires here). */
  counter: number;
  /** The fences of callers' own tokens that hold the key: re-acquiring answers the same one. */
  readonly ownFences: Map<string, number>;
  /** A fair lock's waiters in order of arrival, each with when its place lapses. */
  readonly queue: Map<string, number>;
  election: ElectionRecord | undefined;
  /** Each campaign's entry, with when its stay ends (`performance.now()`). */
  readonly participants: Map<string, number>;
  /** The apps whose callers wait for the plain lock, each with how many (see `waitIn`). */
  readonly processes: Map<string, number>;
}

interface ElectionRecord {
  token: string;
  id: string;
  fence: number;
  /** When its term began (`Date.now()`). */
  since: number;
  ttl: number;
  transitions: number;
}

/** Why an attempt did not get the key (see `AcquireAttempt`). */
type Refused = { retryAfter: number | undefined; held: boolean };

/** What a release did: whether the token held the key, and whom it tells. */
interface Released {
  released: boolean;
  /** The channels to announce on (`releaseChannel`, or the fair head's `turnChannel`). */
  announce: string[];
}

/** What a caller waiting on a channel is told: that a release happened. */
type Listener = () => void;

/**
 * Where `RedisLockTestingModule` keeps its locks: in this process's memory, with the semantics of
 * the library's Redis scripts (TTLs, fences, the shapes, fair queues, elections), each operation
 * one synchronous step as each script is one atomic step in Redis. Several apps of one test that
 * share a store (`RedisLockTestingModule.forRoot({ store })`) contend for the same locks, as
 * instances of an app sharing one Redis do; each app gets a store of its own otherwise.
 *
 * Fences count from 1 on each key; leases are timed with `performance.now()`; what has run out is
 * dropped whenever the key is next touched.
 * @example
 * const store = new InMemoryLockStore();
 * const a = await Test.createTestingModule({ imports: [RedisLockTestingModule.forRoot({ store })] }).compile();
 * const b = await Test.createTestingModule({ imports: [RedisLockTestingModule.forRoot({ store })] }).compile();
 */
export class InMemoryLockStore {
  private readonly keys = new Map<string, KeyState>();
  private readonly channels = new Map<string, Set<Listener>>();

  /**
   * @internal One attempt (see `LockBackend.tryAcquire`): the fence, or why not. `stay` > 0 when
   * the caller will wait; `own` for a caller's own token (its fence is kept while it holds).
   */
  acquire(
    name: string,
    token: string,
    ttl: number,
    shape: LockShape,
    stay: number,
    own: boolean,
  ): number | Refused {
    const state = this.state(name);
    const now = performance.now();
    const busy = this.busyFor(state, token, shape, stay, now);
    if (busy !== undefined) return busy;
    const { entry } = state;
    let renewed = false;
    const kind = kindOf(shape);
    if (kind !== 'exclusive') {
      const shared =
        entry?.kind === kind
          ? entry
          : (state.entry =
              kind === 'read'
                ? { kind, holders: new Map<string, number>(), mark: undefined }
                : { kind, holders: new Map<string, number>() });
      const had = shared.holders.get(token);
      renewed = had !== undefined;
      // A token that holds a place already keeps the longer lease (a handle taken earlier keeps its).
      shared.holders.set(token, Math.max(had ?? 0, now + ttl));
    } else if (entry?.kind === 'exclusive' && entry.token === token) {
      renewed = true;
      // A handle taken earlier keeps a longer lease (RENEW_OWN); a generated token's plain lock
      // comes back only as a resent attempt (RENEW_RESENT), whose TTL it takes.
      const resent = !own && !shape.fair;
      entry.expiresAt = resent ? now + ttl : Math.max(entry.expiresAt, now + ttl);
    } else {
      state.entry = { kind: 'exclusive', token, expiresAt: now + ttl };
      // (A fair grant takes its waiter out of the queue; a plain one leaves the queue as it is.)
      if (shape.fair) state.queue.delete(token);
    }
    const kept = renewed && own ? state.ownFences.get(token) : undefined;
    if (kept !== undefined) return kept;
    const fence = ++state.counter;
    if (own) state.ownFences.set(token, fence);
    return fence;
  }

  /**
   * Why `token` may not take `shape` of the key now (undefined: it may), with what a waiting
   * caller leaves behind: a writer's mark on read locks, a fair waiter's place.
   */
  private busyFor(
    state: KeyState,
    token: string,
    shape: LockShape,
    stay: number,
    now: number,
  ): Refused | undefined {
    const { entry } = state;
    const busy = (until: number | undefined): Refused => ({
      retryAfter: until === undefined ? undefined : msLeft(until, now),
      held: true,
    });
    if (shape.mode === 'read') {
      if (entry === undefined) return undefined;
      if (entry.kind !== 'read') return busy(lastExpiry(entry));
      const mine = entry.holders.has(token);
      return entry.mark !== undefined && !mine ? busy(entry.mark) : undefined;
    }
    if (shape.limit > 1) {
      if (entry === undefined) return undefined;
      if (entry.kind === 'read') {
        if (entry.holders.size > 0) return busy(lastExpiry(entry));
        state.entry = undefined;
        return undefined;
      }
      if (entry.kind === 'exclusive') return busy(entry.expiresAt);
      if (entry.holders.has(token) || entry.holders.size < shape.limit) return undefined;
      return busy(Math.min(...entry.holders.values()));
    }
    if (entry?.kind === 'exclusive' && entry.token === token) return undefined;
    let held = entry !== undefined;
    if (entry?.kind === 'read') {
      held = entry.holders.size > 0;
      // A writer that will wait marks the read locks: no new reader joins until it is in.
      if (held && stay > 0) entry.mark = Math.max(entry.mark ?? 0, now + stay);
    }
    if (shape.fair) {
      const head = state.queue.keys().next().value;
      if (!held && (head === undefined || head === token)) return undefined;
      // A caller that will not wait (tryAcquire) takes no place; one that will keeps its own.
      // (A `Map` keeps a renewed waiter in its place: its order is that of arrival.)
      if (stay > 0) state.queue.set(token, now + stay);
      if (!held) return { retryAfter: undefined, held: false };
    } else if (!held) {
      return undefined;
    }
    return busy(lastExpiry(entry!));
  }

  /** @internal All or none of several plain locks (see `LockBackend.tryAcquireAll`). */
  acquireAll(
    names: readonly string[],
    token: string,
    ttl: number,
  ): number[] | { retryAfter: number | undefined } {
    const now = performance.now();
    for (const name of names) {
      const { entry } = this.state(name);
      if (entry) return { retryAfter: msLeft(lastExpiry(entry) ?? now, now) };
    }
    return names.map((name) => {
      const state = this.state(name);
      state.entry = { kind: 'exclusive', token, expiresAt: now + ttl };
      return ++state.counter;
    });
  }

  /** @internal Resets the lease of `token` (see `LockBackend.extend`): false if it holds none. */
  extend(name: string, token: string, ttl: number, shape: LockShape): boolean {
    const entry = this.entryOf(name, shape);
    if (!entry || !this.holds(entry, token)) return false;
    const until = performance.now() + ttl;
    if (entry.kind === 'exclusive') entry.expiresAt = until;
    else entry.holders.set(token, until);
    return true;
  }

  /**
   * What holds the key if it is of `shape`'s kind (as each shape's scripts read only their own
   * kind of key: a plain lock's owner check never matches a semaphore's place).
   */
  private entryOf(name: string, shape: LockShape): Entry | undefined {
    const { entry } = this.state(name);
    return entry?.kind === kindOf(shape) ? entry : undefined;
  }

  /** @internal Gives up what `token` holds of the key, and says whom to tell. */
  release(name: string, token: string, shape: LockShape): Released {
    const state = this.state(name);
    const entry = this.entryOf(name, shape);
    if (!entry || !this.holds(entry, token)) return { released: false, announce: [] };
    state.ownFences.delete(token);
    // (A shape's entry left empty goes when the key is next read: see `state`.)
    if (entry.kind === 'exclusive') state.entry = undefined;
    else entry.holders.delete(token);
    // A fair lock tells the head of its queue; every other release, every waiter's process.
    if (!shape.fair) return { released: true, announce: [releaseChannel(name)] };
    return { released: true, announce: this.headOf(state, name) };
  }

  /**
   * @internal Passes a plain lock from `token` to `heir` in one step (see `HANDOFF_SCRIPT`): the
   * heir's fence, or 0 if `token` no longer held it (nothing changed).
   */
  handOff(name: string, token: string, heir: string, ttl: number): number {
    const state = this.state(name);
    const { entry } = state;
    if (entry?.kind !== 'exclusive' || (entry.token !== token && entry.token !== heir)) return 0;
    state.ownFences.delete(token);
    state.entry = { kind: 'exclusive', token: heir, expiresAt: performance.now() + ttl };
    return ++state.counter;
  }

  /**
   * @internal A waiter gives up (see `LockBackend.giveUp`): a fair one leaves the queue (telling the
   * next if the key is free), a writer takes back its mark on read locks.
   */
  giveUp(name: string, token: string, shape: LockShape): string[] {
    const state = this.state(name);
    const { entry } = state;
    // Only a writer (a plain or fair lock) marks read locks; a reader or a semaphore's caller
    // leaves nothing behind.
    if (kindOf(shape) !== 'exclusive') return [];
    if (entry?.kind === 'read') entry.mark = undefined;
    if (!shape.fair) return [];
    state.queue.delete(token);
    // (Read again: a read lock's entry left with neither readers nor mark is gone.)
    return this.state(name).entry ? [] : this.headOf(state, name);
  }

  /** @internal Whether anything holds the key (a writer's mark on it counts, as in Redis). */
  isLocked(name: string): boolean {
    return this.state(name).entry !== undefined;
  }

  /** @internal Whether `token` holds the key, whatever the shape. */
  isHeld(name: string, token: string): boolean {
    return this.holds(this.state(name).entry, token);
  }

  /** @internal A term began (see `RECORD_TERM_SCRIPT`). */
  recordTerm(name: string, token: string, id: string, fence: number, ttl: number): void {
    const state = this.state(name);
    if (state.entry?.kind !== 'exclusive' || state.entry.token !== token) return;
    if (state.election?.token === token) return;
    const transitions = (state.election?.transitions ?? 0) + 1;
    state.election = { token, id, fence, since: Date.now(), ttl, transitions };
  }

  /** @internal A campaign stays listed for `stay` more ms, or (0) leaves. */
  participate(name: string, entry: string, stay: number): void {
    const { participants } = this.state(name);
    if (stay === 0) participants.delete(entry);
    else participants.set(entry, performance.now() + stay);
  }

  /** @internal Who leads, and with `participants`, who campaigns (see `ELECTION_SCRIPT`). */
  election(name: string, participants: boolean): Election {
    const state = this.state(name);
    const record = state.election;
    const { entry } = state;
    const leads = record && entry?.kind === 'exclusive' && entry.token === record.token;
    const ttlLeft = leads ? msLeft(entry.expiresAt, performance.now()) : 0;
    return {
      leader: leads
        ? {
            id: record.id,
            fence: record.fence,
            since: record.since,
            renewedAt: Math.max(record.since, Date.now() - (record.ttl - ttlLeft)),
          }
        : null,
      transitions: record?.transitions ?? 0,
      participants: participants
        ? [...new Set([...state.participants.keys()].map((e) => e.replace(/^[^:]*:/, '')))].sort()
        : [],
    };
  }

  /** @internal What holds the key (see `INSPECT_SCRIPT`). */
  inspect(name: string): Inspection {
    const state = this.state(name);
    const { entry } = state;
    const now = performance.now();
    const last =
      entry && entry.kind !== 'exclusive' && entry.holders.size === 0 ? undefined : entry;
    const fence = last?.kind === 'exclusive' ? (state.ownFences.get(last.token) ?? null) : null;
    const mark = entry?.kind === 'read' && entry.mark !== undefined ? 1 : 0;
    return {
      mode: last ? MODES[last.kind] : null,
      holders: last === undefined ? 0 : last.kind === 'exclusive' ? 1 : last.holders.size,
      ttlLeft: last ? msLeft(lastExpiry(last) ?? now, now) : 0,
      fence,
      // (As in Redis: the queued waiters count only while a plain lock or nothing holds it.)
      waiting:
        mark + (last && last.kind !== 'exclusive' ? 0 : state.queue.size + state.processes.size),
      token: last?.kind === 'exclusive' ? last.token : '',
    };
  }

  /** @internal Frees the key whatever holds it (see `FORCE_RELEASE_SCRIPT`), and whom to tell. */
  forceRelease(name: string): Freed & { announce: string[] } {
    const state = this.state(name);
    const fence = ++state.counter;
    const { entry } = state;
    const freed = this.inspect(name);
    state.ownFences.clear();
    if (entry?.kind === 'read' && entry.mark !== undefined) entry.holders.clear();
    else state.entry = undefined;
    const announce = freed.holders === 0 ? [] : [...this.headOf(state, name), releaseChannel(name)];
    return { mode: freed.mode, holders: freed.holders, fence, announce };
  }

  /**
   * @internal A caller of app `process` waits for the plain lock (`by` 1), or no longer (-1): the
   * apps with callers waiting are the key's queue of waiting processes that `inspect` counts.
   */
  waitIn(name: string, process: string, by: 1 | -1): void {
    const { processes } = this.state(name);
    const count = (processes.get(process) ?? 0) + by;
    if (count > 0) processes.set(process, count);
    else processes.delete(process);
  }

  /** @internal Whether callers of app `process` wait for the plain lock `name` (see `waitIn`). */
  waitsIn(name: string, process: string): boolean {
    return this.keys.get(name)?.processes.has(process) ?? false;
  }

  /** @internal Calls `listener` for each announcement on `channel` until the returned function is called. */
  subscribe(channel: string, listener: Listener): () => void {
    let listeners = this.channels.get(channel);
    if (!listeners) this.channels.set(channel, (listeners = new Set()));
    listeners.add(listener);
    return () => {
      listeners.delete(listener);
      if (listeners.size === 0 && this.channels.get(channel) === listeners) {
        this.channels.delete(channel);
      }
    };
  }

  /** @internal Announces on `channels`: how many listeners heard (as `PUBLISH` answers). */
  publish(channels: readonly string[]): number {
    let heard = 0;
    for (const channel of channels) {
      for (const listener of [...(this.channels.get(channel) ?? [])]) {
        heard++;
        listener();
      }
    }
    return heard;
  }

  /**
   * @internal What the store keeps for names starting with `prefix`, for tests: each name (as
   * the Redis layout names it) with the ms left, and the tokens holding it.
   */
  contents(prefix: string): { name: string; ttl: number; holders: string[] }[] {
    const now = performance.now();
    const found: { name: string; ttl: number; holders: string[] }[] = [];
    for (const name of this.keys.keys()) {
      if (!name.startsWith(prefix)) continue;
      const state = this.state(name);
      const { entry } = state;
      if (entry) {
        const holders = entry.kind === 'exclusive' ? [entry.token] : [...entry.holders.keys()];
        found.push({ name, ttl: (lastExpiry(entry) ?? now) - now, holders });
      }
      if (state.queue.size > 0) {
        found.push({
          name: `${name}:queue`,
          ttl: Math.max(...state.queue.values()) - now,
          holders: [],
        });
      }
    }
    return found;
  }

  /** The key's state, with what has run out dropped. */
  private state(name: string): KeyState {
    let state = this.keys.get(name);
    if (!state) {
      state = {
        entry: undefined,
        counter: 0,
        ownFences: new Map(),
        queue: new Map(),
        election: undefined,
        participants: new Map(),
        processes: new Map(),
      };
      this.keys.set(name, state);
      return state;
    }
    const now = performance.now();
    const { entry } = state;
    if (entry?.kind === 'exclusive') {
      if (entry.expiresAt <= now) state.entry = undefined;
    } else if (entry) {
      for (const [token, until] of entry.holders) if (until <= now) entry.holders.delete(token);
      if (entry.kind === 'read' && entry.mark !== undefined && entry.mark <= now) {
        entry.mark = undefined;
      }
      if (entry.holders.size === 0 && (entry.kind !== 'read' || entry.mark === undefined)) {
        state.entry = undefined;
      }
    }
    for (const token of state.ownFences.keys()) {
      if (!this.holds(state.entry, token)) state.ownFences.delete(token);
    }
    for (const [token, until] of state.queue) if (until <= now) state.queue.delete(token);
    for (const [entry, until] of state.participants) {
      if (until <= now) state.participants.delete(entry);
    }
    return state;
  }

  private holds(entry: Entry | undefined, token: string): boolean {
    return entry?.kind === 'exclusive' ? entry.token === token : entry?.holders.has(token) === true;
  }

  /** The channel of the fair queue's head, if anyone waits. */
  private headOf(state: KeyState, name: string): string[] {
    const head = state.queue.keys().next().value;
    return head === undefined ? [] : [turnChannel(name, head)];
  }
}

/** The channel a key's releases are announced on. */
export const releaseChannel = (name: string): string => `release:${name}`;

/** The channel a fair waiter hears on that it is its turn. */
export const turnChannel = (name: string, token: string): string => `turn:${name}:${token}`;

/** The whole ms from `now` until `end`, as Redis's `PTTL` answers them. */
const msLeft = (end: number, now: number): number => Math.max(0, Math.ceil(end - now));

/** When the last holder of `entry` (or a writer's mark) runs out. */
function lastExpiry(entry: Entry): number | undefined {
  if (entry.kind === 'exclusive') return entry.expiresAt;
  const ends = [...entry.holders.values()];
  if (entry.kind === 'read' && entry.mark !== undefined) ends.push(entry.mark);
  return ends.length === 0 ? undefined : Math.max(...ends);
}

/** The kind of entry `shape` takes. */
const kindOf = (shape: LockShape): Entry['kind'] =>
  shape.mode === 'read' ? 'read' : shape.limit > 1 ? 'semaphore' : 'exclusive';

const MODES = { exclusive: 'exclusive', semaphore: 'semaphore', read: 'read' } as const;
