import type { Cluster, Redis, RedisOptions } from 'ioredis';
import { LockArgumentError, RedisLockConfigurationError } from './errors/redis-lock.errors.js';
import type { AcquireOptions } from './interfaces/lock.interface.js';
import type { LockShape } from './interfaces/lock-backend.interface.js';
import type {
  LockTimeoutResponse,
  WithLockOptions,
} from './interfaces/with-lock-options.interface.js';
import type {
  LockDefaults,
  RedisLockModuleOptions,
  ReplicaAck,
} from './interfaces/redis-lock-options.interface.js';

/** The built-in defaults: the single place they are written down. */
const DEFAULT_KEY_PREFIX = 'lock:';
export const DEFAULT_LOCK_DEFAULTS = {
  ttl: 10_000,
  acquireTimeout: 5_000,
  autoExtend: undefined,
  retryInterval: 1_000,
  retryJitter: 50,
} as const satisfies Required<Omit<LockDefaults, 'autoExtend'>> & { autoExtend: undefined };

/**
 * Longest wait for any one Redis reply, in ms. A lock script runs in microseconds and a healthy
 * Redis answers within a few ms even across zones; 1 s leaves room for a first connection (TCP,
 * TLS, AUTH, script load) while staying well under the default TTL, so a hung extension still
 * leaves the watchdog more tries before the lease runs out.
 */
const DEFAULT_COMMAND_TIMEOUT = 1_000;

/**
 * Default `fenceRetention`: a key's fence counter outlives its lock by one minute. Long enough
 * that fences keep growing through any server clock step of up to a minute (NTP steps are usually
 * well under a second); short enough that an app locking a thousand new keys a second keeps about
 * 60,000 counters (~8 MB), not millions.
 */
const DEFAULT_FENCE_RETENTION = 60_000;

/**
 * Default `handoffTurn`: how long one process may pass a contended lock among its own waiters
 * (ms, from the first handoff of its turn) before a release frees it for waiters in other
 * processes. A handoff within a process costs no round trip (~0.03 ms between sections); a switch
 * to another process costs a release, a message and that process's attempt (~0.4–0.6 ms), so the
 * longer the turn, the fewer switches, the shorter the handoff gaps and the higher the throughput,
 * and the longer a waiter in another process may wait for its turn. Measured side by side
 * (`npm run bench`, hot key, 2 processes × 10 workers, 1 ms sections, no think time): turns of
 * 25, 100, 150 and 250 ms gave a handoff gap p99 of 0.47, 0.45, 0.45 and 0.19 ms (the best peer's
 * 0.56–0.89 in the same runs), a wait p99 of 45, 116, 167 and 266 ms (the peers' 550–1,060).
 * Only turns of 250 ms kept the switches (0.5 % of handoffs) out of the gap's p99.
 */
export const DEFAULT_HANDOFF_TURN = 250;

/**
 * Default `driftFactor` in Redlock mode: a lock's validity is `ttl - ttl * driftFactor - 2 ms`,
 * the margin the Redlock description gives for clocks of the nodes running at different rates.
 */
export const DEFAULT_DRIFT_FACTOR = 0.01;

/** Fewest independent masters in Redlock mode: with fewer, one node down stops all locking. */
const MIN_REDLOCK_NODES = 3;

/** Largest duration accepted: Node timers fire at once beyond 2^31 - 1 ms (~24.8 days). */
export const MAX_DURATION = 2_147_483_647;

export type ResolvedDefaults = Omit<Required<LockDefaults>, 'autoExtend'> & {
  autoExtend: boolean | undefined;
};

/** Where the Redis connection comes from; exactly one source. */
export type RedisSource =
  | { kind: 'client'; client: Redis | Cluster }
  | { kind: 'connection'; connection: string | RedisOptions }
  | { kind: 'nodes'; nodes: readonly (Redis | string | RedisOptions)[]; driftFactor: number };

export interface ResolvedModuleOptions {
  source: RedisSource;
  keyPrefix: string;
  commandTimeout: number;
  fenceRetention: number;
  handoffTurn: number;
  replicaAck: ReplicaAck | undefined;
  defaults: ResolvedDefaults;
  timeoutResponse: LockTimeoutResponse;
}

/** What a lock call runs with, once defaults are applied and everything is checked. */
export interface ResolvedAcquireOptions {
  ttl: number;
  acquireTimeout: number;
  autoExtend: boolean;
  signal: AbortSignal | undefined;
  token: string | undefined;
  /** What is taken: `PLAIN` unless `limit` or `mode` say otherwise. */
  shape: LockShape;
  /** See `AcquireOptions.holdAtLeast` (0: none). */
  holdAtLeast: number;
}

/** The plain, exclusive lock (a writer). */
export const PLAIN: LockShape = Object.freeze({ limit: 1, mode: 'write', fair: false });
const READ: LockShape = Object.freeze({ limit: 1, mode: 'read', fair: false });
const FAIR: LockShape = Object.freeze({ limit: 1, mode: 'write', fair: true });

/** Which public method is asking: decides the `autoExtend` default and whether waiting is allowed. */
export type AcquireMode = 'acquire' | 'tryAcquire' | 'using';

const TIMEOUT_RESPONSE_KEYS = ['timeoutStatus', 'timeoutException'];
const MODULE_KEYS = [
  'client',
  'connection',
  'nodes',
  'driftFactor',
  'keyPrefix',
  'commandTimeout',
  'fenceRetention',
  'handoffTurn',
  'replicaAck',
  'defaults',
  ...TIMEOUT_RESPONSE_KEYS,
];
const WITH_LOCK_KEYS = [
  'key',
  'onBusy',
  'holdAtLeast',
  'ttl',
  'acquireTimeout',
  'autoExtend',
  'limit',
  'mode',
  'fair',
  ...TIMEOUT_RESPONSE_KEYS,
];
const DEFAULTS_KEYS = Object.keys(DEFAULT_LOCK_DEFAULTS);
const ACQUIRE_KEYS = [
  'ttl',
  'holdAtLeast',
  'acquireTimeout',
  'autoExtend',
  'signal',
  'token',
  'limit',
  'mode',
  'fair',
];

/**
 * Says what is wrong with a duration, or `undefined` if it is fine. Durations are whole
 * milliseconds, finite, > 0 (or >= 0 where `allowZero`), and fit a Node timer.
 */
/** The most holders a counting semaphore may admit (a Redis sorted set holds them all). */
const MAX_LIMIT = 1_000_000;

/**
 * The shape `limit`, `mode` and `fair` ask for; a `LockArgumentError` for a bad value or a
 * combination that does not exist (naming both options).
 */
function lockShape(limit: unknown = 1, mode: unknown = 'write', fair: unknown = false): LockShape {
  if (typeof limit !== 'number' || !Number.isInteger(limit) || limit < 1 || limit > MAX_LIMIT) {
    throw new LockArgumentError('limit', limit, `must be a whole number from 1 to ${MAX_LIMIT}`);
  }
  if (mode !== 'write' && mode !== 'read') {
    throw new LockArgumentError('mode', mode, "must be 'write' or 'read'");
  }
  if (mode === 'read' && limit > 1) {
    throw new LockArgumentError(
      'mode + limit',
      { mode, limit },
      'a read lock admits any number of readers: give mode or limit, not both',
    );
  }
  if (typeof fair !== 'boolean') throw new LockArgumentError('fair', fair, 'must be true or false');
  if (fair && (limit > 1 || mode === 'read')) {
    const [other, value] = limit > 1 ? ['limit', limit] : ['mode', mode];
    throw new LockArgumentError(
      `fair + ${other}`,
      { fair, [other]: value },
      'fair queues exclusive locks only: not with a semaphore or a read lock',
    );
  }
  if (fair) return FAIR;
  if (mode === 'read') return READ;
  return limit === 1 ? PLAIN : Object.freeze({ limit, mode: 'write', fair: false });
}

/**
 * The shortest TTL, in ms. A lock's lease is its TTL less 1 % and 2 ms, counted from when its
 * command was sent: a shorter TTL would leave next to nothing, and a grant arriving after it is not
 * a lock (see `LockService.obtain`).
 */
const MIN_TTL = 10;

/** What is wrong with `value` as a lock's TTL, if anything. */
export function ttlProblem(value: unknown): string | undefined {
  const problem = durationProblem(value, false);
  if (problem || (value as number) >= MIN_TTL) return problem;
  return `must be at least ${MIN_TTL} ms: a lock's lease is its TTL less 1 % and 2 ms, so a shorter one would be over before its grant arrived`;
}

function durationProblem(value: unknown, allowZero: boolean): string | undefined {
  const floor = allowZero ? '>= 0' : '> 0';
  if (typeof value !== 'number' || !Number.isFinite(value) || !Number.isInteger(value)) {
    return `must be a whole number of milliseconds ${floor}`;
  }
  if (allowZero ? value < 0 : value <= 0) return `must be ${floor}`;
  if (value > MAX_DURATION) return `must be at most ${MAX_DURATION} ms (~24.8 days)`;
  return undefined;
}

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
  const defaults: ResolvedDefaults = { ...DEFAULT_LOCK_DEFAULTS };
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
  return {
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

/**
 * Validates `@WithLock` options when the decorator is applied. Throws
 * `RedisLockConfigurationError` naming `@WithLock(Class.method).option`. The key is checked by
 * the key compiler.
 */
export function validateWithLockOptions(options: WithLockOptions, method: string): void {
  const path = `@WithLock(${method}).`;
  const fail = (option: string, value: unknown, problem: string): never => {
    throw new RedisLockConfigurationError(option, value, problem);
  };
  if (!isOptionsObject(options)) {
    fail(`@WithLock(${method})`, options, "pass an object such as { key: 'order:{0}' }");
  }
  rejectUnknownKeys(options, WITH_LOCK_KEYS, path, fail);
  for (const name of ['ttl', 'acquireTimeout'] as const) {
    const value = options[name];
    const problem =
      value === undefined
        ? undefined
        : name === 'ttl'
          ? ttlProblem(value)
          : durationProblem(value, true);
    if (problem) fail(`${path}${name}`, value, problem);
  }
  if (options.autoExtend !== undefined && typeof options.autoExtend !== 'boolean') {
    fail(`${path}autoExtend`, options.autoExtend, 'must be true or false');
  }
  try {
    lockShape(options.limit, options.mode, options.fair);
  } catch (error) {
    if (!(error instanceof LockArgumentError)) throw error;
    fail(`${path}${error.argument}`, error.value, error.problem);
  }
  checkTimeoutResponse(options, path, fail);
  if (options.holdAtLeast !== undefined) {
    const shape = lockShape(options.limit, options.mode, options.fair);
    const problem = holdAtLeastProblem(options.holdAtLeast, options.ttl, shape);
    if (problem) fail(`${path}${problem[0]}`, options.holdAtLeast, problem[1]);
  }
  const { onBusy } = options;
  if (onBusy !== undefined && onBusy !== 'fail' && onBusy !== 'skip') {
    fail(`${path}onBusy`, onBusy, "must be 'fail' or 'skip'");
  }
  if (onBusy === 'skip' && (options.timeoutStatus ?? options.timeoutException) !== undefined) {
    fail(
      `${path}onBusy + ${path}${options.timeoutStatus === undefined ? 'timeoutException' : 'timeoutStatus'}`,
      onBusy,
      "a call that skips never answers a lock timeout: give onBusy: 'skip' or a timeout answer, not both",
    );
  }
}

function checkTimeoutResponse(
  given: LockTimeoutResponse,
  path: string,
  fail: (option: string, value: unknown, problem: string) => never,
): LockTimeoutResponse {
  const { timeoutStatus, timeoutException } = given;
  if (timeoutStatus !== undefined && timeoutException !== undefined) {
    fail(`${path}timeoutStatus + ${path}timeoutException`, undefined, 'give one of them, not both');
  }
  if (
    timeoutStatus !== undefined &&
    (typeof timeoutStatus !== 'number' ||
      !Number.isInteger(timeoutStatus) ||
      timeoutStatus < 400 ||
      timeoutStatus > 599)
  ) {
    fail(
      `${path}timeoutStatus`,
      timeoutStatus,
      'must be an HTTP error status from 400 to 599, such as 409, 423 or 503',
    );
  }
  if (timeoutException !== undefined && typeof timeoutException !== 'function') {
    fail(
      `${path}timeoutException`,
      timeoutException,
      'must be a function (error, context) => the error to throw',
    );
  }
  return { timeoutStatus, timeoutException };
}

/** Validates one call's key and options and fills in the defaults. Throws `LockArgumentError`. */
export function resolveAcquireOptions(
  key: unknown,
  options: AcquireOptions | undefined,
  defaults: ResolvedDefaults,
  mode: AcquireMode,
): ResolvedAcquireOptions {
  const fail = (argument: string, value: unknown, problem: string): never => {
    throw new LockArgumentError(argument, value, problem);
  };
  assertKey(key);
  const opts = options === undefined ? {} : options;
  if (!isOptionsObject(opts)) fail('options', opts, 'must be an object');
  rejectUnknownKeys(opts, ACQUIRE_KEYS, '', fail);

  const ttl = opts.ttl === undefined ? defaults.ttl : opts.ttl;
  const problem = ttlProblem(ttl);
  if (problem) fail('ttl', ttl, problem);
  const givenTimeout =
    opts.acquireTimeout === undefined ? defaults.acquireTimeout : opts.acquireTimeout;
  const timeoutProblem = durationProblem(givenTimeout, true);
  if (timeoutProblem) fail('acquireTimeout', givenTimeout, timeoutProblem);
  // Checked above all the same: a bad value is an error even where it is not used.
  const acquireTimeout = mode === 'tryAcquire' ? 0 : givenTimeout;
  const autoExtend =
    opts.autoExtend === undefined ? (defaults.autoExtend ?? mode === 'using') : opts.autoExtend;
  if (typeof autoExtend !== 'boolean') fail('autoExtend', autoExtend, 'must be true or false');
  if (opts.signal !== undefined && !(opts.signal instanceof AbortSignal)) {
    fail('signal', opts.signal, 'must be an AbortSignal');
  }
  if (opts.token !== undefined && (typeof opts.token !== 'string' || opts.token.length === 0)) {
    fail('token', opts.token, 'must be a non-empty string');
  }
  const shape =
    opts.limit === undefined && opts.mode === undefined && opts.fair === undefined
      ? PLAIN
      : lockShape(opts.limit, opts.mode, opts.fair);
  const holdAtLeast = opts.holdAtLeast ?? 0;
  const holdProblem = holdAtLeastProblem(holdAtLeast, ttl, shape);
  if (holdProblem) fail(holdProblem[0], holdAtLeast, holdProblem[1]);
  return {
    ttl,
    acquireTimeout,
    autoExtend,
    signal: opts.signal,
    token: opts.token,
    shape,
    holdAtLeast,
  };
}

/**
 * What is wrong with `holdAtLeast` for a lock of `ttl` and `shape` (the option at fault, naming
 * both where a combination is), or `undefined`.
 */
function holdAtLeastProblem(
  value: unknown,
  ttl: number | undefined,
  shape: LockShape,
): [string, string] | undefined {
  const problem = durationProblem(value, true);
  if (problem) return ['holdAtLeast', problem];
  if (ttl !== undefined && (value as number) > ttl) {
    return ['holdAtLeast', `must not exceed the ttl (${ttl} ms): the key cannot outlive its TTL`];
  }
  if ((value as number) > 0 && (shape.limit !== 1 || shape.mode !== 'write' || shape.fair)) {
    const other = shape.mode === 'read' ? 'mode' : shape.fair ? 'fair' : 'limit';
    return [
      `holdAtLeast + ${other}`,
      'holdAtLeast keeps an exclusive key taken after its release: plain locks only (not with limit, mode or fair)',
    ];
  }
  return undefined;
}

/**
 * What is wrong with the options of `lead()` or `@WhileLeader` (`[option, value, problem]`), or
 * `undefined`.
 */
export function leadOptionsProblem(options: unknown): [string, unknown, string] | undefined {
  if (options === undefined) return undefined;
  if (!isOptionsObject(options)) return ['options', options, 'must be an object'];
  for (const [name, value] of Object.entries(options)) {
    if (name !== 'ttl') return [name, value, 'is not an option of a leadership (only ttl is)'];
  }
  const { ttl } = options as { ttl?: unknown };
  const problem = ttl === undefined ? undefined : ttlProblem(ttl);
  return problem ? ['ttl', ttl, problem] : undefined;
}

/**
 * Throws `LockArgumentError` unless `key` is a non-empty, well-formed Unicode string. A lone
 * surrogate has no UTF-8 form: Redis would receive U+FFFD for it, so two different keys would
 * share one lock.
 */
export function assertKey(key: unknown): asserts key is string {
  if (typeof key !== 'string' || key.length === 0) {
    throw new LockArgumentError('key', key, 'must be a non-empty string');
  }
  if (!(key as unknown as WellFormed).isWellFormed()) {
    throw new LockArgumentError(
      'key',
      key,
      'must be well-formed Unicode (it contains a lone UTF-16 surrogate, which has no UTF-8 form)',
    );
  }
}

/**
 * The keys of a multi-key lock in the order they are locked: each checked as a key, none twice,
 * sorted by UTF-16 code units — one order for every caller and process, whatever order each
 * names them in.
 */
export function lockOrder(keys: readonly unknown[]): string[] {
  if (keys.length === 0) {
    throw new LockArgumentError(
      'key',
      keys,
      'must be a non-empty string or a non-empty array of them',
    );
  }
  const seen = new Set<string>();
  for (const key of keys) {
    assertKey(key);
    if (seen.has(key)) {
      throw new LockArgumentError('key', keys, `names "${key}" twice: list each key once`);
    }
    seen.add(key);
  }
  return [...seen].sort();
}

/** `String.prototype.isWellFormed` (Node 20), which the ES2022 library typings do not declare yet. */
interface WellFormed {
  isWellFormed(): boolean;
}

/** An object of named options: not null, not an array (whose elements would be taken as none). */
function isOptionsObject(value: unknown): value is object {
  return typeof value === 'object' && value !== null && !Array.isArray(value);
}

function rejectUnknownKeys(
  object: object,
  known: readonly string[],
  path: string,
  fail: (name: string, value: unknown, problem: string) => never,
): void {
  for (const name of Object.keys(object)) {
    if (!known.includes(name)) {
      const hint =
        path === '' && DEFAULTS_KEYS.includes(name)
          ? ` (did you mean the module option defaults.${name}?)`
          : '';
      fail(
        `${path}${name}`,
        (object as Record<string, unknown>)[name],
        `unknown option${hint}; known: ${known.join(', ')}`,
      );
    }
  }
}

export function isRedisClient(value: unknown): value is Redis | Cluster {
  // Duck-typed so that a client from another copy of ioredis (a different version in the
  // app's node_modules) is still accepted.
  return (
    typeof value === 'object' &&
    value !== null &&
    typeof (value as Redis).defineCommand === 'function' &&
    typeof (value as Redis).duplicate === 'function'
  );
}
