import type { Cluster, Redis } from 'ioredis';
import type { LockShape } from '../interfaces/lock-backend.interface.js';
import type { KeyLayout } from './key-layout.js';
import {
  ACQUIRE_ALL_SCRIPT,
  ACQUIRE_OWN_TOKEN_SCRIPT,
  ACQUIRE_SCRIPT,
  ACQUIRE_UNRESERVED_SCRIPT,
  ACQUIRE_REDLOCK_SCRIPT,
  EXTEND_SCRIPT,
  HANDOFF_SCRIPT,
  HANDOFF_UNRESERVED_SCRIPT,
  DROP_MARK_SCRIPT,
  PASS_ON_SCRIPT,
  ACQUIRE_OWN_TOKEN_REDLOCK_SCRIPT,
  RAISE_FENCE_SCRIPT,
  RELEASE_SCRIPT,
  RELEASE_SHARDED_SCRIPT,
} from './lock.scripts.js';
import {
  ACQUIRE_FAIR_SCRIPT,
  RELEASE_FAIR_SCRIPT,
  RELEASE_FAIR_SHARDED_SCRIPT,
} from './fair.scripts.js';
import {
  ACQUIRE_READ_SCRIPT,
  ACQUIRE_SEMAPHORE_SCRIPT,
  EXTEND_READ_SCRIPT,
  EXTEND_SEMAPHORE_SCRIPT,
  IS_HELD_SCRIPT,
  RELEASE_READ_SCRIPT,
  RELEASE_READ_SHARDED_SCRIPT,
  RELEASE_SEMAPHORE_SCRIPT,
  RELEASE_SEMAPHORE_SHARDED_SCRIPT,
} from './shape.scripts.js';
import { ELECTION_SCRIPT, PARTICIPATE_SCRIPT, RECORD_TERM_SCRIPT } from './election.scripts.js';
import {
  FORCE_RELEASE_SCRIPT,
  FORCE_RELEASE_SHARDED_SCRIPT,
  INSPECT_SCRIPT,
} from './inspect.scripts.js';
import { lockScripts, type ScriptDefinition } from './lock-scripts.runner.js';

/** KEYS (3), then token, channel, message (and for the plain lock, see `NAME_NEXT`). */
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
export const EXTEND_COMMANDS = [
  'redisLockExtend',
  'redisLockExtendSemaphore',
  'redisLockExtendRead',
] as const;
/** Release commands by [family][sharded pub/sub], and their scripts. */
export const RELEASE_COMMANDS = [
  ['redisLockRelease', 'redisLockReleaseSharded'],
  ['redisLockReleaseSemaphore', 'redisLockReleaseSemaphoreSharded'],
  ['redisLockReleaseRead', 'redisLockReleaseReadSharded'],
] as const;
const RELEASE_SCRIPTS = [
  [RELEASE_SCRIPT, RELEASE_SHARDED_SCRIPT],
  [RELEASE_SEMAPHORE_SCRIPT, RELEASE_SEMAPHORE_SHARDED_SCRIPT],
  [RELEASE_READ_SCRIPT, RELEASE_READ_SHARDED_SCRIPT],
] as const;

/** 0: the plain lock (a writer), 1: a place in a counting semaphore, 2: a read lock. */
export const familyOf = (shape: LockShape): 0 | 1 | 2 =>
  shape.mode === 'read' ? 2 : shape.limit > 1 ? 1 : 0;
/**
 * The plain lock's keys: lock, fence counter, own fence record (see `KeyLayout.ownFenceKey`).
 */
export function plainKeys(layout: KeyLayout, lockKey: string): [string, string, string] {
  return [lockKey, layout.counterKey(lockKey), layout.ownFenceKey(lockKey)];
}

/**
 * What a release of the plain lock takes: the lock, the own fence record, and the queue of
 * waiting processes (see `NAME_NEXT`).
 */
export function releaseKeys(layout: KeyLayout, lockKey: string): [string, string, string] {
  return [lockKey, layout.ownFenceKey(lockKey), layout.turnsKey(lockKey)];
}

/** KEYS (3; 2 per key to take several; 5 for a fair lock), then ARGV. */
export type LockScriptArgs = readonly (string | number)[];

/** Fair-lock release commands by [sharded pub/sub], and their scripts. */
export const FAIR_RELEASE_COMMANDS = [
  'redisLockReleaseFair',
  'redisLockReleaseFairSharded',
] as const;
const FAIR_RELEASE_SCRIPTS = [RELEASE_FAIR_SCRIPT, RELEASE_FAIR_SHARDED_SCRIPT] as const;
type FairReleaseCommand = (...args: LockScriptArgs) => Promise<number>;

/** The lock scripts (see `lockScripts`: EVALSHA, EVAL if the server does not have it). */
export interface LockCommands {
  /** ARGV: token, ttl, the fence counter's TTL (ttl + retention; for a semaphore, then the limit). */
  redisLockAcquire(...args: LockScriptArgs): Promise<number>;
  redisLockAcquireUnreserved(...args: LockScriptArgs): Promise<number>;
  /** Redlock, a generated token: `redisLockAcquireUnreserved`'s arguments, then a fence floor. */
  redisLockAcquireRedlock(...args: LockScriptArgs): Promise<number | [number, string]>;
  redisLockAcquireOwnToken(...args: LockScriptArgs): Promise<number>;
  redisLockAcquireSemaphore(...args: LockScriptArgs): Promise<number>;
  redisLockAcquireRead(...args: LockScriptArgs): Promise<number>;
  redisLockExtend(...args: LockScriptArgs): Promise<number>;
  redisLockExtendSemaphore(...args: LockScriptArgs): Promise<number>;
  redisLockExtendRead(...args: LockScriptArgs): Promise<number>;
  redisLockRelease: ReleaseCommand;
  redisLockReleaseSharded: ReleaseCommand;
  redisLockReleaseSemaphore: ReleaseCommand;
  redisLockReleaseSemaphoreSharded: ReleaseCommand;
  redisLockReleaseRead: ReleaseCommand;
  redisLockReleaseReadSharded: ReleaseCommand;
  redisLockIsHeld(lockKey: string, token: string): Promise<number>;
  redisLockDropMark(lockKey: string, turnsKey: string, leaving?: string): Promise<number>;
  redisLockAcquireFair(...args: LockScriptArgs): Promise<number>;
  /** The number of keys first (it varies), then KEYS and ARGV. */
  redisLockAcquireAll(...args: LockScriptArgs): Promise<number[] | number>;
  redisLockReleaseFair: FairReleaseCommand;
  redisLockReleaseFairSharded: FairReleaseCommand;
  /**
   * Redlock, a caller's own token: `[fence, how]` when granted (`how`: 0 a new fence, 1 the fence
   * this node recorded at its grant, 2 the holder's fence), else a number.
   */
  redisLockAcquireOwnTokenRedlock(
    ...args: LockScriptArgs
  ): Promise<number | [number, number] | [number, string]>;
  redisLockRaiseFence(
    lockKey: string,
    counterKey: string,
    recordKey: string,
    token: string,
    fence: number,
    counterTtl: number,
    own: 0 | 1,
  ): Promise<number>;
  redisLockHandoff: HandoffCommand;
  redisLockHandoffUnreserved: HandoffCommand;
  redisLockPassOn: HandoffCommand;
  /** See `election.scripts.ts`. */
  redisLockRecordTerm(
    lockKey: string,
    recordKey: string,
    token: string,
    id: string,
    fence: number,
    ttl: number,
    keep: number,
    leastTransitions: number,
  ): Promise<number>;
  redisLockParticipate(
    participantsKey: string,
    recordKey: string,
    entry: string,
    stay: number,
    keep: number,
  ): Promise<number>;
  redisLockElection(
    lockKey: string,
    recordKey: string,
    participantsKey: string,
    listParticipants: 0 | 1,
  ): Promise<(string | number)[]>;
  /** See `inspect.scripts.ts`. */
  redisLockInspect(
    lockKey: string,
    ownFenceKey: string,
    turnsKey: string,
    stayKey: string,
  ): Promise<(string | number)[]>;
  /** See `FORCE_RELEASE_SCRIPT`. */
  redisLockForceRelease(...args: ForceReleaseArgs): Promise<[string, number, string]>;
  redisLockForceReleaseSharded(...args: ForceReleaseArgs): Promise<[string, number, string]>;
}

type ForceReleaseArgs = (string | number)[];

type HandoffCommand = (
  lockKey: string,
  counterKey: string,
  token: string,
  heirToken: string,
  heirTtl: number,
  counterTtl: number,
) => Promise<number>;

/** Defines every lock script on `client` (see `lockScripts`). */
export function defineLockCommands(client: Redis | Cluster): LockCommands {
  const scripts: Record<string, ScriptDefinition> = {
    redisLockAcquireFair: { numberOfKeys: 5, lua: ACQUIRE_FAIR_SCRIPT },
    redisLockAcquireAll: { lua: ACQUIRE_ALL_SCRIPT },
    redisLockIsHeld: { numberOfKeys: 1, lua: IS_HELD_SCRIPT },
    redisLockDropMark: { numberOfKeys: 2, lua: DROP_MARK_SCRIPT },
    redisLockAcquire: { numberOfKeys: 3, lua: ACQUIRE_SCRIPT },
    redisLockAcquireUnreserved: { numberOfKeys: 3, lua: ACQUIRE_UNRESERVED_SCRIPT },
    redisLockAcquireRedlock: { numberOfKeys: 3, lua: ACQUIRE_REDLOCK_SCRIPT },
    redisLockHandoff: { numberOfKeys: 2, lua: HANDOFF_SCRIPT },
    redisLockHandoffUnreserved: { numberOfKeys: 2, lua: HANDOFF_UNRESERVED_SCRIPT },
    redisLockPassOn: { numberOfKeys: 2, lua: PASS_ON_SCRIPT },
    redisLockRaiseFence: { numberOfKeys: 3, lua: RAISE_FENCE_SCRIPT },
    redisLockAcquireOwnTokenRedlock: { numberOfKeys: 3, lua: ACQUIRE_OWN_TOKEN_REDLOCK_SCRIPT },
    redisLockRecordTerm: { numberOfKeys: 2, lua: RECORD_TERM_SCRIPT },
    redisLockParticipate: { numberOfKeys: 2, lua: PARTICIPATE_SCRIPT },
    redisLockElection: { numberOfKeys: 3, lua: ELECTION_SCRIPT },
    redisLockInspect: { numberOfKeys: 4, lua: INSPECT_SCRIPT },
    redisLockForceRelease: { numberOfKeys: 6, lua: FORCE_RELEASE_SCRIPT },
    redisLockForceReleaseSharded: { numberOfKeys: 6, lua: FORCE_RELEASE_SHARDED_SCRIPT },
  };
  // Each family's scripts take 3 keys (see `shapeKeys`, `plainKeys`, `releaseKeys`).
  const family = (names: readonly string[], luas: readonly string[]): void =>
    names.forEach((name, i) => (scripts[name] = { numberOfKeys: 3, lua: luas[i] }));
  family(ACQUIRE_COMMANDS, [
    ACQUIRE_OWN_TOKEN_SCRIPT,
    ACQUIRE_SEMAPHORE_SCRIPT,
    ACQUIRE_READ_SCRIPT,
  ]);
  family(EXTEND_COMMANDS, [EXTEND_SCRIPT, EXTEND_SEMAPHORE_SCRIPT, EXTEND_READ_SCRIPT]);
  RELEASE_COMMANDS.forEach((names, i) => family(names, RELEASE_SCRIPTS[i]));
  FAIR_RELEASE_COMMANDS.forEach((name, i) => {
    scripts[name] = { numberOfKeys: 4, lua: FAIR_RELEASE_SCRIPTS[i] };
  });
  return lockScripts(client, scripts) as unknown as LockCommands;
}

/** A script that takes a lock: what an attempt sends (and, with `replicaAck`, `WAIT` behind). */
export type AcquireCommand =
  | (typeof ACQUIRE_COMMANDS)[number]
  | 'redisLockAcquire'
  | 'redisLockAcquireUnreserved'
  | 'redisLockAcquireFair';

/**
 * The script of an acquisition attempt for a lock of `shape`, for a generated token (`fresh`) or
 * the caller's own: `reserving` when a generated token's grant of a plain lock takes a block of
 * fences for its in-process heirs (see `FENCE_STRIDE`).
 */
export function acquireCommand(
  shape: LockShape,
  fresh: boolean,
  reserving: boolean,
): AcquireCommand {
  if (shape.fair) return 'redisLockAcquireFair';
  const family = familyOf(shape);
  if (family !== 0 || !fresh) return ACQUIRE_COMMANDS[family];
  return reserving ? 'redisLockAcquire' : 'redisLockAcquireUnreserved';
}

/**
 * The arguments of that attempt on `lockKey`: its keys, then token, TTL and the fence counter's
 * TTL, and per shape: how long a waiter's claim lasts (`queueStay`: a fair waiter's place, a
 * writer's mark on read locks, a process's place in the queue of a plain lock; 0 for a caller
 * that will not wait), a semaphore's limit, and whether the token is a generated one (`fresh`: a
 * semaphore's place or a read lock then gets a fresh fence; a caller's own token keeps its own).
 * `waiting`: the id of the caller's process, for a generated token's plain lock that will wait
 * (it joins the key's queue of waiting processes, see `JOIN_TURNS`).
 */
export function acquireArgs(
  layout: KeyLayout,
  lockKey: string,
  shape: LockShape,
  token: string,
  ttl: number,
  counterTtl: number,
  queueStay: number,
  fresh: boolean,
  waiting?: string,
): LockScriptArgs {
  const counterKey = layout.counterKey(lockKey);
  const own = fresh ? 0 : 1;
  if (shape.fair) {
    const [queue, stay] = layout.queueKeys(lockKey);
    const record = layout.ownFenceKey(lockKey);
    return [lockKey, counterKey, queue, stay, record, token, ttl, counterTtl, queueStay, own];
  }
  const family = familyOf(shape);
  if (family === 1) {
    return [...layout.shapeKeys(lockKey), token, ttl, counterTtl, shape.limit, own];
  }
  if (family === 2) return [...layout.shapeKeys(lockKey), token, ttl, counterTtl, own];
  // A generated token's script takes the queue of waiting processes where the caller's own takes
  // its record (see `acquireCommand`). A writer that will wait holds new readers off (see
  // MARK_WRITER), for as long as its place in a fair queue would last.
  const keys = fresh ? [lockKey, counterKey, layout.turnsKey(lockKey)] : plainKeys(layout, lockKey);
  if (queueStay === 0) return [...keys, token, ttl, counterTtl];
  return fresh && waiting !== undefined
    ? [...keys, token, ttl, counterTtl, queueStay, waiting]
    : [...keys, token, ttl, counterTtl, queueStay];
}
