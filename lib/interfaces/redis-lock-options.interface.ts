import type { Cluster, Redis, RedisOptions } from 'ioredis';
import type { LogKeys } from '../errors/redis-lock.errors.js';
import type { LockTimeoutResponse } from './with-lock-options.interface.js';

/** Defaults applied to every lock taken through the module, overridable per call. */
export interface LockDefaults {
  /**
   * TTL of a lock in ms: how long Redis keeps it if its holder stops extending it (crashes).
   * @default 10_000
   */
  ttl?: number;
  /**
   * How long `acquire()`, `using()` and `@WithLock` wait for a held lock, in ms. `0`: one attempt.
   * @default 5_000
   */
  acquireTimeout?: number;
  /**
   * Extend held locks in the background. When unset: off for `acquire()` / `tryAcquire()`
   * (a forgotten handle must still expire), on for `using()` and `@WithLock`. When set, it
   * applies to every method unless a call says otherwise.
   * @default undefined
   */
  autoExtend?: boolean;
  /**
   * Longest pause between two attempts of the first waiter of a key in a process, in ms (the
   * others sleep until a release reaches them or they become first). Waiters are woken by the
   * release itself (pub/sub); this only bounds what a lost wake-up or a holder that keeps
   * extending can cost.
   * @default 1_000
   */
  retryInterval?: number;
  /**
   * Random extra delay, up to this many ms, added to every timed retry so that waiters do
   * not all retry at the same instant. `0` turns it off.
   * @default 50
   */
  retryJitter?: number;
}

/** See `RedisLockModuleOptions.replicaAck`. */
export interface ReplicaAck {
  /** Replicas that must have each lock write. */
  replicas: number;
  /** Longest wait for them, in ms. */
  timeout: number;
}

/**
 * Options of `RedisLockModule.forRoot()` and the factory of `forRootAsync()`. Give exactly one of
 * `client`, `connection` or `nodes`. `timeoutStatus` / `timeoutException` set how `@WithLock` handlers answer
 * a lock timeout (default: HTTP 409 with `Retry-After`).
 */
export interface RedisLockModuleOptions extends LockTimeoutResponse {
  /**
   * Your own ioredis client. The module uses it (and a `duplicate()` of it for pub/sub,
   * which it owns) and never closes it.
   */
  client?: Redis | Cluster;
  /**
   * A Redis URL or ioredis options. The module creates the client and closes it on shutdown.
   * @example 'redis://127.0.0.1:6379'
   */
  connection?: string | RedisOptions;
  /**
   * Redlock mode: at least 3 independent Redis masters (an odd count: 3 or 5), each an ioredis
   * client (used, never closed), a URL or ioredis options (the module creates and closes those).
   * A lock is granted when a majority of the nodes grant it in time; see "Topologies" in the README.
   * @example ['redis://10.0.0.1:6379', 'redis://10.0.0.2:6379', 'redis://10.0.0.3:6379']
   */
  nodes?: Array<Redis | string | RedisOptions>;
  /**
   * Redlock mode only: the clock drift allowed for, as a share of the TTL. A lock taken with
   * `ttl` is valid for `ttl - ttl * driftFactor - 2 ms` after its attempt was sent.
   * @default 0.01
   */
  driftFactor?: number;
  /**
   * Prepended to every lock key in Redis. May not contain `{` or `}`: the library puts each
   * key in a hash tag of its own so that its fencing counter lives in the same cluster slot.
   * @default 'lock:'
   */
  keyPrefix?: string;
  /**
   * Longest lock key, in characters (without `keyPrefix`), for every call: a longer key is a
   * `LockArgumentError`, and on `@WithLock` a `LockKeyResolutionError` (a route answers 400). Keys
   * built from request input are what this bounds: a key names a resource, it does not carry data.
   * `@WithLock({ maxKeyLength })` may set a lower one for its method.
   * @default 512
   */
  maxKeyLength?: number;
  /**
   * How many callers of this `LockService` may wait for locks at once: `perKey` for one key,
   * `perProcess` in all. A caller beyond either fails at once (`LockAcquireTimeoutError` with
   * `queueFull`; a route answers 409 with `Retry-After`) instead of waiting: a flood of requests
   * costs bounded memory, timers and subscriptions. Calls that do not wait (`tryAcquire()`, a free
   * key, `acquireTimeout: 0`) are never refused. `0` lets no caller wait.
   * @default { perKey: 1_000, perProcess: 5_000 }
   */
  maxWaiters?: { perKey?: number; perProcess?: number };
  /**
   * How lock keys appear in the library's log lines, in the messages of its errors and in
   * `events`, for keys that carry personal data (`cart:alice@example.com`): `'plain'` shows them
   * JSON-quoted and cut at 100 characters; `'hashed'` as `key#` and the first 16 hex digits of
   * the key's SHA-256 (the same in every process: `printf %s 'cart:alice@example.com' | sha256sum`
   * finds its lines); `'hidden'` as `(key hidden)`. An error's `key` field still holds the key,
   * not enumerable unless `'plain'`, so loggers that print an error's fields leave it out.
   * @default 'plain'
   */
  logKeys?: LogKeys;
  /**
   * Longest wait for any one Redis reply, in ms, for every operation (acquire attempts, release,
   * extension, `isLocked`, closing connections on shutdown). A reply that does not come in time
   * fails the call with `LockBackendError` (`timedOut: true`) instead of waiting for a reconnect
   * that may never come. Holds for a `client` you pass as well; the module never reconfigures it.
   * @default 1_000
   */
  commandTimeout?: number;
  /**
   * How long the fence counter (one for every key of the deployment; one per hash slot on a
   * Cluster) outlives the last acquisition, extension or handoff of every lock it fenced, in ms. A
   * new holder's `fence` is the Redis server's clock in microseconds, or the counter's last value
   * + 1 where that is higher: while the counter lives, greater than every earlier one's even if
   * the clock stepped back; after it expires, greater unless that clock stepped back by more than
   * the time since. Longer: safe through bigger clock steps, at no cost per key. `0`: the counter
   * lives exactly as long as the longest lock.
   * @default 60_000
   */
  fenceRetention?: number;
  /**
   * How long one app instance may pass a contended lock among its own waiters, in ms, before a
   * release frees it for waiters in other instances. A handoff within the instance takes no round
   * trip; a switch to another instance costs a release, a message and an attempt (~0.5 ms with
   * the lock free). Longer: fewer switches, more throughput on a hot key, and a waiter in another
   * instance may wait up to this long for its turn. `0`: every release frees the lock, and this
   * instance's waiters hold back while other instances' take it. Only plain locks of one Redis
   * deployment are passed on (see Waiting in the README).
   * @default 25
   */
  handoffTurn?: number;
  /**
   * Off by default. When set, every acquisition and extension waits (Redis `WAIT`) until
   * `replicas` replicas of the master have the write, for at most `timeout` ms (shorter than
   * `commandTimeout`). Fewer in time: the acquisition is undone and fails, an extension fails,
   * with `LockReplicationError`. Narrows, does not close, the window in which a failover to a
   * replica that lacks the lock lets a second holder in. Not with `nodes`.
   */
  replicaAck?: ReplicaAck;
  /** Defaults for every lock taken through this module. */
  defaults?: LockDefaults;
}
