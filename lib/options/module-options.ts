/** `RedisLockModule` options: checked once when the module is created, defaults applied. */

import type { Cluster, Redis, RedisOptions } from 'ioredis';
import { RedisLockConfigurationError, keyView } from '../errors/redis-lock.errors.js';
import type { LockBackend } from '../interfaces/lock-backend.interface.js';
import type { LockTimeoutResponse } from '../interfaces/with-lock-options.interface.js';
import type {
  RedisLockModuleOptions,
  ReplicaAck,
} from '../interfaces/redis-lock-options.interface.js';
import {
  TIMEOUT_RESPONSE_KEYS,
  checkTimeoutResponse,
  durationProblem,
  isOptionsObject,
  isRedisClient,
  keyLengthProblem,
  rejectUnknownKeys,
  ttlProblem,
} from './checks.js';
import {
  DEFAULTS_KEYS,
  DEFAULT_COMMAND_TIMEOUT,
  DEFAULT_DRIFT_FACTOR,
  DEFAULT_FENCE_RETENTION,
  DEFAULT_HANDOFF_TURN,
  DEFAULT_KEY_PREFIX,
  DEFAULT_LOCK_DEFAULTS,
  DEFAULT_MAX_KEY_LENGTH,
  DEFAULT_MAX_WAITERS,
  MIN_REDLOCK_NODES,
  ResolvedDefaults,
} from './defaults.js';

/** Where the Redis connection comes from; exactly one source. */
export type RedisSource =
  | { kind: 'client'; client: Redis | Cluster }
  | { kind: 'connection'; connection: string | RedisOptions }
  | { kind: 'nodes'; nodes: readonly (Redis | string | RedisOptions)[]; driftFactor: number }
  | { kind: 'backend'; create: BackendOf };

/** Makes the backend of a module without Redis (see `BACKEND_SOURCE`). */
export type BackendOf = (options: ResolvedModuleOptions) => LockBackend;

/**
 * The option, under this symbol, of a module that keeps its locks somewhere else than in Redis:
 * `RedisLockTestingModule`'s, in memory. A symbol, not a name: no user option can collide with it
 * or give it by mistake, and `resolveModuleOptions` takes it as the only source.
 */
export const BACKEND_SOURCE = Symbol('nestjs-redis-lock: backend');

export interface ResolvedModuleOptions {
  source: RedisSource;
  keyPrefix: string;
  commandTimeout: number;
  fenceRetention: number;
  handoffTurn: number;
  replicaAck: ReplicaAck | undefined;
  defaults: ResolvedDefaults;
  timeoutResponse: LockTimeoutResponse;
  maxWaiters: { perKey: number; perProcess: number };
}

const MODULE_KEYS = [
  'client',
  'connection',
  'nodes',
  'driftFactor',
  'keyPrefix',
  'maxKeyLength',
  'maxWaiters',
  'logKeys',
  'commandTimeout',
  'fenceRetention',
  'handoffTurn',
  'replicaAck',
  'defaults',
  ...TIMEOUT_RESPONSE_KEYS,
];

const LOG_KEYS: readonly unknown[] = ['plain', 'hashed', 'hidden'];

/** Validates the module options and applies the defaults. Throws `RedisLockConfigurationError`. */
export function resolveModuleOptions(raw: RedisLockModuleOptions): ResolvedModuleOptions {
  const fail = (option: string, value: unknown, problem: string): never => {
    throw new RedisLockConfigurationError(option, value, problem);
  };
  if (!isOptionsObject(raw)) {
    fail('options', raw, 'pass an object such as { connection: "redis://127.0.0.1:6379" }');
  }
  rejectUnknownKeys(raw, MODULE_KEYS, '', fail);

  const source = resolveSource(raw, fail);
  const keyPrefix = raw.keyPrefix === undefined ? DEFAULT_KEY_PREFIX : raw.keyPrefix;
  if (typeof keyPrefix !== 'string') fail('keyPrefix', keyPrefix, 'must be a string');
  if (/[{}]/.test(keyPrefix)) {
    fail(
      'keyPrefix',
      keyPrefix,
      'may not contain { or }: each lock key gets its own hash tag so that its fencing counter shares its cluster slot',
    );
  }

  const commandTimeout =
    raw.commandTimeout === undefined ? DEFAULT_COMMAND_TIMEOUT : raw.commandTimeout;
  const commandTimeoutProblem = durationProblem(commandTimeout, false);
  if (commandTimeoutProblem) fail('commandTimeout', commandTimeout, commandTimeoutProblem);

  const fenceRetention =
    raw.fenceRetention === undefined ? DEFAULT_FENCE_RETENTION : raw.fenceRetention;
  const fenceRetentionProblem = durationProblem(fenceRetention, true);
  if (fenceRetentionProblem) fail('fenceRetention', fenceRetention, fenceRetentionProblem);
  if (fenceRetention === 0 && raw.nodes !== undefined) {
    fail(
      'fenceRetention + nodes',
      fenceRetention,
      "in Redlock mode a fence is the highest count of a majority of nodes; with 0 every release deletes the counts, and the next fence comes from the clocks of the nodes that answer first, which differ between independent masters (fences went backwards): keep fenceRetention above the nodes' clock offset (the default is one minute)",
    );
  }

  const handoffTurn = raw.handoffTurn === undefined ? DEFAULT_HANDOFF_TURN : raw.handoffTurn;
  const handoffTurnProblem = durationProblem(handoffTurn, true);
  if (handoffTurnProblem) fail('handoffTurn', handoffTurn, handoffTurnProblem);
  for (const other of ['nodes', 'replicaAck'] as const) {
    if (raw.handoffTurn !== undefined && raw[other] !== undefined) {
      fail(
        `handoffTurn + ${other}`,
        handoffTurn,
        `with ${other} a release never passes a lock on within the process (${other === 'nodes' ? 'each Redlock node grants it by itself' : 'every grant must wait for the replicas'}), so there are no turns to bound: drop handoffTurn`,
      );
    }
  }

  const replicaAck = checkReplicaAck(raw, commandTimeout, fail);

  const given = raw.defaults === undefined ? {} : raw.defaults;
  if (!isOptionsObject(given)) fail('defaults', given, 'must be an object');
  rejectUnknownKeys(given, DEFAULTS_KEYS, 'defaults.', fail);
  const maxKeyLength = raw.maxKeyLength === undefined ? DEFAULT_MAX_KEY_LENGTH : raw.maxKeyLength;
  const maxKeyLengthProblem = keyLengthProblem(maxKeyLength);
  if (maxKeyLengthProblem) fail('maxKeyLength', maxKeyLength, maxKeyLengthProblem);
  const logKeys = raw.logKeys === undefined ? 'plain' : raw.logKeys;
  if (!LOG_KEYS.includes(logKeys)) {
    fail('logKeys', logKeys, "must be 'plain', 'hashed' or 'hidden'");
  }
  const defaults: ResolvedDefaults = {
    ...DEFAULT_LOCK_DEFAULTS,
    maxKeyLength,
    keyView: keyView(logKeys),
  };
  for (const name of ['ttl', 'acquireTimeout', 'retryInterval', 'retryJitter'] as const) {
    const value = given[name];
    if (value === undefined) continue;
    const problem =
      name === 'ttl' ? ttlProblem(value) : durationProblem(value, name !== 'retryInterval');
    if (problem) fail(`defaults.${name}`, value, problem);
    defaults[name] = value;
  }
  if (given.autoExtend !== undefined) {
    if (typeof given.autoExtend !== 'boolean') {
      fail('defaults.autoExtend', given.autoExtend, 'must be true or false');
    }
    defaults.autoExtend = given.autoExtend;
  }
  const timeoutResponse = checkTimeoutResponse(raw, '', fail);
  const maxWaiters: { perKey: number; perProcess: number } = { ...DEFAULT_MAX_WAITERS };
  if (raw.maxWaiters !== undefined) {
    if (!isOptionsObject(raw.maxWaiters)) {
      fail('maxWaiters', raw.maxWaiters, 'must be an object such as { perKey: 1_000 }');
    }
    rejectUnknownKeys(raw.maxWaiters, Object.keys(DEFAULT_MAX_WAITERS), 'maxWaiters.', fail);
    for (const name of ['perKey', 'perProcess'] as const) {
      const value = raw.maxWaiters[name];
      if (value === undefined) continue;
      if (typeof value !== 'number' || !Number.isSafeInteger(value) || value < 0) {
        fail(`maxWaiters.${name}`, value, 'must be a whole number of callers, at least 0');
      }
      maxWaiters[name] = value;
    }
  }
  return {
    maxWaiters,
    source,
    keyPrefix,
    commandTimeout,
    fenceRetention,
    handoffTurn,
    replicaAck,
    defaults,
    timeoutResponse,
  };
}

/** Checks that exactly one of `client`, `connection` and `nodes` is given, and that it is usable. */
function resolveSource(
  raw: RedisLockModuleOptions,
  fail: (option: string, value: unknown, problem: string) => never,
): RedisSource {
  const given = SOURCE_KEYS.filter((name) => raw[name] !== undefined);
  const create = (raw as { [BACKEND_SOURCE]?: BackendOf })[BACKEND_SOURCE];
  if (create !== undefined) {
    const redisOnly = [...given, ...REDIS_ONLY_KEYS.filter((name) => raw[name] !== undefined)];
    if (redisOnly.length > 0) {
      fail(
        redisOnly.join(' + '),
        undefined,
        'RedisLockTestingModule keeps its locks in memory, without Redis: drop them (to test against a Redis, import RedisLockModule with them instead)',
      );
    }
    return { kind: 'backend', create };
  }
  if (given.length !== 1) {
    fail(
      given.length === 0 ? SOURCE_KEYS.join(' | ') : given.join(' + '),
      undefined,
      given.length === 0
        ? 'give exactly one of `client` (your ioredis client), `connection` (a URL or ioredis options) or `nodes` (Redlock: independent masters)'
        : `give exactly one of them, not ${given.length}`,
    );
  }
  if (raw.driftFactor !== undefined && raw.nodes === undefined) {
    fail(
      `driftFactor + ${given[0]}`,
      raw.driftFactor,
      'driftFactor applies to Redlock mode only: give `nodes`, or drop driftFactor',
    );
  }
  if (raw.client !== undefined) {
    if (!isRedisClient(raw.client)) {
      fail('client', raw.client, 'must be an ioredis Redis or Cluster instance');
    }
    return { kind: 'client', client: raw.client };
  }
  if (raw.connection !== undefined) {
    checkConnection('connection', raw.connection, fail);
    return { kind: 'connection', connection: raw.connection };
  }
  const nodes = raw.nodes;
  if (!Array.isArray(nodes) || nodes.length < MIN_REDLOCK_NODES) {
    fail(
      'nodes',
      nodes,
      `Redlock needs at least ${MIN_REDLOCK_NODES} independent Redis masters (an odd count such as 3 or 5): ` +
        'a lock is granted by a majority of them',
    );
  }
  const seen = new Map<string, number>();
  nodes.forEach((node, i) => {
    const option = `nodes[${i}]`;
    if (isRedisClient(node)) {
      if ((node as unknown as Partial<Cluster>).isCluster) {
        fail(option, node, 'must be a standalone master: a Cluster is one deployment, not a node');
      }
    } else {
      checkConnection(option, node, fail);
    }
    const address = nodeAddress(node);
    const earlier = seen.get(address);
    if (earlier !== undefined) {
      fail(
        `nodes[${earlier}] + ${option}`,
        address,
        'name the same server twice: Redlock needs independent masters, or one server counts for two votes',
      );
    }
    seen.set(address, i);
  });
  const driftFactor = raw.driftFactor === undefined ? DEFAULT_DRIFT_FACTOR : raw.driftFactor;
  if (
    typeof driftFactor !== 'number' ||
    !Number.isFinite(driftFactor) ||
    driftFactor < 0 ||
    driftFactor >= 0.5
  ) {
    fail('driftFactor', driftFactor, 'must be a number >= 0 and < 0.5 (the default is 0.01)');
  }
  return { kind: 'nodes', nodes: nodes, driftFactor };
}

const SOURCE_KEYS = ['client', 'connection', 'nodes'] as const;

/** Options that only mean something with a Redis (see `BACKEND_SOURCE`). */
const REDIS_ONLY_KEYS = ['driftFactor', 'replicaAck'] as const;

function checkReplicaAck(
  raw: RedisLockModuleOptions,
  commandTimeout: number,
  fail: (option: string, value: unknown, problem: string) => never,
): ReplicaAck | undefined {
  const ack = raw.replicaAck;
  if (ack === undefined) return undefined;
  if (raw.nodes !== undefined) {
    fail(
      'replicaAck + nodes',
      ack,
      'Redlock nodes are independent masters: their majority, not replicas, keeps a lock; drop replicaAck',
    );
  }
  if (!isOptionsObject(ack)) fail('replicaAck', ack, 'must be an object { replicas, timeout }');
  rejectUnknownKeys(ack, ['replicas', 'timeout'], 'replicaAck.', fail);
  if (typeof ack.replicas !== 'number' || !Number.isInteger(ack.replicas) || ack.replicas < 1) {
    fail('replicaAck.replicas', ack.replicas, 'must be a whole number >= 1');
  }
  const problem = durationProblem(ack.timeout, false);
  if (problem) fail('replicaAck.timeout', ack.timeout, problem);
  if (ack.timeout >= commandTimeout) {
    fail(
      'replicaAck.timeout + commandTimeout',
      ack.timeout,
      `must be shorter than commandTimeout (${commandTimeout} ms): the acknowledgement is part of the reply that commandTimeout bounds`,
    );
  }
  return { replicas: ack.replicas, timeout: ack.timeout };
}

function checkConnection(
  option: string,
  connection: unknown,
  fail: (option: string, value: unknown, problem: string) => never,
): void {
  if (typeof connection === 'string') {
    if (!/^rediss?:\/\/./.test(connection)) {
      fail(option, connection, 'a URL must start with redis:// or rediss://');
    }
  } else if (!isOptionsObject(connection)) {
    fail(option, connection, 'must be a redis:// URL or an ioredis options object');
  }
}

/** `host:port` of a Redlock node, to catch one server given twice. */
function nodeAddress(node: Redis | string | RedisOptions): string {
  if (typeof node === 'string') {
    try {
      const url = new URL(node);
      return `${url.hostname.toLowerCase()}:${url.port || 6379}`;
    } catch {
      return node;
    }
  }
  const options = isRedisClient(node) ? node.options : node;
  if (options.path) return options.path;
  return `${(options.host ?? 'localhost').toLowerCase()}:${options.port ?? 6379}`;
}
