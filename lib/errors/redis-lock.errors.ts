import { createHash } from 'node:crypto';

/**
 * Base class of every error this library throws or uses to abort a signal.
 * Catch this to handle all lock failures at once; check the subclass (never the message text)
 * to tell them apart.
 */
export class RedisLockError extends Error {
  constructor(message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.name = new.target.name;
  }
}

/** Longest part of a key a message or log line shows. */
const SHOWN_KEY_LENGTH = 100;

/**
 * A lock key as messages and log lines show it: JSON-quoted (a line break or a quote in a key
 * that came from a request cannot forge a log line) and cut at 100 characters, with its length.
 */
export function quoteKey(key: string): string {
  return key.length > SHOWN_KEY_LENGTH
    ? `${quoted(`${key.slice(0, SHOWN_KEY_LENGTH)}…`)} (${key.length} characters)`
    : quoted(key);
}

/**
 * Characters JSON leaves as they are that a log reader may still take as a line break (U+0085,
 * U+2028, U+2029) or that change how a line reads (other control and format characters: DEL, C1
 * controls, bidirectional overrides, zero-width ones).
 */
const UNSAFE_IN_LINES = /[\p{Cc}\p{Cf}\p{Zl}\p{Zp}]/gu;

/** `text` JSON-quoted, with what could still break or bend a log line escaped as `\uXXXX`. */
function quoted(text: string): string {
  return JSON.stringify(text).replace(UNSAFE_IN_LINES, (char) => {
    const code = char.codePointAt(0)!;
    return code > 0xffff ? `\\u{${code.toString(16)}}` : `\\u${code.toString(16).padStart(4, '0')}`;
  });
}

/**
 * How the library shows lock keys in messages, log lines and events (the module's `logKeys`):
 * `'plain'` quoted and cut at 100 characters, `'hashed'` as `key#` and the first 16 hex digits of
 * the key's SHA-256 (the same key gives the same hash in every process and line), `'hidden'` not
 * at all.
 */
export type LogKeys = 'plain' | 'hashed' | 'hidden';

/** A lock key as messages, log lines and events show it (see `LogKeys`). */
export type KeyView = (key: string) => string;

/** The `KeyView` of a `logKeys` mode. */
export function keyView(mode: LogKeys): KeyView {
  return mode === 'plain' ? quoteKey : mode === 'hashed' ? hashedKey : hiddenKey;
}

function hashedKey(key: string): string {
  return `key#${createHash('sha256').update(key).digest('hex').slice(0, 16)}`;
}

function hiddenKey(): string {
  return '(key hidden)';
}

/**
 * With keys hashed or hidden, an error's `key` is not enumerable: a logger that prints an error's
 * own fields (pino, `util.inspect`) leaves it out, as the message does; code still reads it.
 */
function keepKeyQuiet(error: { readonly key: string }, view: KeyView): void {
  if (view !== quoteKey) Object.defineProperty(error, 'key', { enumerable: false });
}

/**
 * The configuration is invalid: module options (thrown while the app boots), `@WithLock` options
 * (thrown when the decorator is applied, i.e. when the class is defined), or a `@WithLock` method
 * that is used in a way the decorator cannot support.
 */
export class RedisLockConfigurationError extends RedisLockError {
  /**
   * The value that was given (`undefined` when the problem is a missing option), without secrets:
   * a connection string shows its scheme and host at most, an options object's passwords are
   * `'***'` (the error is printed whole when a bootstrap fails).
   */
  readonly value: unknown;

  constructor(
    /** The option at fault, as a path (`defaults.ttl`, `client`, `@WithLock(OrdersController.pay).key`, ...). */
    readonly option: string,
    value: unknown,
    /** What is wrong and how to fix it. */
    readonly problem: string,
  ) {
    const shown = withoutSecrets(value);
    super(`Invalid option "${option}"${given(shown)}: ${problem}`);
    this.value = shown;
  }
}

/**
 * A call was given a bad argument: an empty key, a duration that is not a whole positive
 * number of milliseconds, a foreign `AbortSignal`, an unknown option name.
 */
export class LockArgumentError extends RedisLockError {
  /**
   * The value that was given. Not enumerable: it may be request data of any size (a key from a
   * body), so `util.inspect` and `JSON.stringify` of the error, as loggers print it, leave it out;
   * the message shows it quoted and cut.
   */
  declare readonly value: unknown;

  constructor(
    /** The argument or option at fault (`key`, `ttl`, `acquireTimeout`, ...). */
    readonly argument: string,
    value: unknown,
    /** What is wrong and how to fix it. */
    readonly problem: string,
    /** How a key given as the value is shown (the module's `logKeys`). */
    view?: KeyView,
  ) {
    super(
      `Invalid lock argument "${argument}"${view && typeof value === 'string' ? ` (${view(value)})` : given(value, argument)}: ${problem}`,
    );
    Object.defineProperty(this, 'value', { value, enumerable: false });
  }
}

/** Why `@WithLock` built no key: see {@link LockKeyResolutionError.reason}. */
export type LockKeyProblem =
  /** A placeholder resolved to no key part (`undefined`, `null`, an object, `''`…), or the key function returned no key. */
  | 'unresolved'
  /** The key is longer than `maxKeyLength`. */
  | 'too-long'
  /** The decorator's `validateKey` did not accept it. */
  | 'refused';

/**
 * `@WithLock` could not build a lock key from the method's arguments: a placeholder resolved to
 * `undefined`, `null`, an object, an empty string or another non-key value, the key function
 * did not return a non-empty string, the key is longer than `maxKeyLength`, or `validateKey`
 * refused it. No lock was taken and the method did not run. A route answers it 400 Bad Request
 * (the key comes from the request), without the key.
 */
export class LockKeyResolutionError extends RedisLockError {
  /**
   * What the placeholder resolved to (the whole key when too long or refused). Not enumerable: it
   * comes from the request, so `util.inspect` and `JSON.stringify` of the error leave it out.
   */
  declare readonly value: unknown;

  constructor(
    /** Where the decorator sits, as `Class.method`. */
    readonly method: string,
    /** The key template, or `'(key function)'`. */
    readonly template: string,
    /** The placeholder that failed (`{0.id}`), `'(key function)'`, or `'(whole key)'` (too long, refused). */
    readonly placeholder: string,
    value: unknown,
    /** What is wrong. */
    readonly reason: LockKeyProblem = 'unresolved',
    /** The `maxKeyLength` in force, when the key is too long. */
    readonly maxKeyLength?: number,
    /** How keys are shown (the module's `logKeys`). */
    view: KeyView = quoteKey,
  ) {
    const from = `Cannot build the lock key of ${method} from ${quoted(template)}`;
    super(
      reason === 'too-long'
        ? `${from}: the key is ${(value as string).length} characters long, more than maxKeyLength (${maxKeyLength}). A key names a resource: check the argument, or raise maxKeyLength.`
        : reason === 'refused'
          ? `${from}: validateKey refused the key ${view(value as string)}. Check the argument.`
          : `${from}: ${placeholder} resolved to ${typeof value === 'string' ? unkeyedString(value) : describe(value, undefined, view === quoteKey)}. ` +
            `A key part must be a non-empty, well-formed string or a finite number; check the argument the placeholder points at.`,
    );
    Object.defineProperty(this, 'value', { value, enumerable: false });
  }
}

/**
 * The lock was not acquired within `acquireTimeout`: another holder kept it (`busy`), or, rarely,
 * nobody held it but no grant came in time with lease left (`busy: false`: see the field).
 */
export class LockAcquireTimeoutError extends RedisLockError {
  constructor(
    /** The lock key, without the module's `keyPrefix`. */
    readonly key: string,
    /** How long this call waited, in ms. */
    readonly waitedMs: number,
    /** The `acquireTimeout` in force, in ms. */
    readonly acquireTimeout: number,
    /** How long the current holder's lock still had to live at the last attempt, in ms (`undefined` when unknown). */
    readonly retryAfterMs?: number,
    /**
     * Whether another holder had the key when the wait ended: what `onBusy: 'skip'` skips. `false`
     * when nobody else did, yet no lock came in time: a grant whose reply came after its lease had
     * run out (a slow Redis or a stalled process), a key of several whose lease ran out before the
     * last one was taken, a fair waiter behind a queue entry of a caller that no longer asks.
     */
    readonly busy = true,
    /**
     * How long the key stays taken, as far as this process knows: a moving average of its last
     * holds of the key, at most `retryAfterMs` (`undefined` if it saw none). What a route's 409
     * gives as `Retry-After` (at least 1 s).
     */
    readonly expectedWaitMs?: number,
    /**
     * Set when the call did not wait at all: so many callers of this `LockService` already waited
     * (for this key: `limit` `'perKey'`, in all: `'perProcess'`) that `maxWaiters` refused it.
     */
    readonly queueFull?: { readonly limit: 'perKey' | 'perProcess'; readonly waiters: number },
    /** How the key is shown (the module's `logKeys`). */
    view: KeyView = quoteKey,
  ) {
    super(
      `Could not acquire lock ${view(key)} within ${acquireTimeout} ms (waited ${Math.round(waitedMs)} ms): ` +
        (queueFull
          ? `${queueFull.waiters} callers of this LockService already wait ${queueFull.limit === 'perKey' ? 'for this key' : 'for locks'} (maxWaiters.${queueFull.limit}), so this one did not. Retry later, or raise maxWaiters.${queueFull.limit}.`
          : busy
            ? 'another holder kept it. Retry later, raise acquireTimeout, or shorten the work done under the lock.'
            : 'nobody else held it, but no grant came with lease left in time (Redis slow to answer, a TTL shorter than a round trip, or a fair queue whose first waiter stopped asking). Check Redis latency against the ttl, or raise acquireTimeout.'),
    );
    keepKeyQuiet(this, view);
  }
}

/** Why a lock was lost: see {@link LockLostError.reason}. */
export type LockLostReason =
  /** Redis no longer holds our token under the key: it expired or was deleted, and may be someone else's now. */
  | 'not-held'
  /** No extension could be confirmed before the lock's TTL ran out (Redis slow or unreachable). */
  | 'unconfirmed'
  /** The TTL ran out and auto-extension was off. */
  | 'expired'
  /** The module shut down and released the lock while the work was still running. */
  | 'shutdown'
  /**
   * A call re-entered a lock held further up its call chain (a nested call, a fork of a section)
   * and was still inside when the outer holder released it: the work outlived its section.
   */
  | 'released';

/**
 * The lock is no longer ours, or may not be. `lock.signal` aborts with this error as its
 * `reason`; `extend()` throws it. Work protected by the lock should stop at once: another
 * holder may already be running it.
 */
export class LockLostError extends RedisLockError {
  /**
   * The token this holder had. Not enumerable: it stays out of `util.inspect`, `console.log` and
   * `JSON.stringify` of the error, so logging the error never writes an owner token.
   */
  declare readonly token: string;

  constructor(
    /** The lock key, without the module's `keyPrefix`. */
    readonly key: string,
    token: string,
    /** What was observed. */
    readonly reason: LockLostReason,
    options?: { cause?: unknown; view?: KeyView },
  ) {
    const view = options?.view ?? quoteKey;
    super(
      `Lock ${view(key)} was lost (${LOST_REASONS[reason]}). ${LOST_ADVICE}`,
      options && 'cause' in options ? { cause: options.cause } : undefined,
    );
    Object.defineProperty(this, 'token', { value: token, enumerable: false });
    keepKeyQuiet(this, view);
  }
}

const LOST_REASONS: Record<LockLostReason, string> = {
  'not-held': 'Redis no longer holds this token: the lock expired or was deleted',
  unconfirmed: 'no extension could be confirmed before its TTL ran out',
  expired: 'its TTL ran out and autoExtend is off',
  shutdown: 'the module shut down and released it',
  released:
    'this call re-entered a lock held further up its call chain and was still inside when that holder released it: await the calls you start inside a section, or start them outside it',
};
const LOST_ADVICE =
  'Stop the protected work; use the fencing token to make the resource reject stale writers, ' +
  'and give the lock a longer ttl or enable autoExtend if the work is legitimately slow.';

/** The wait for a lock was cancelled through the caller's `AbortSignal`. */
export class LockAcquireAbortedError extends RedisLockError {
  constructor(
    /** The lock key, without the module's `keyPrefix`. */
    readonly key: string,
    /** The signal's `reason`. */
    reason: unknown,
    /** How the key is shown (the module's `logKeys`). */
    view: KeyView = quoteKey,
    /** What was waiting: acquiring the lock, or `Leadership.elected()`. */
    what: 'Acquiring lock' | 'Waiting to lead' = 'Acquiring lock',
  ) {
    super(`${what} ${view(key)} was aborted by the caller's signal.`, { cause: reason });
    keepKeyQuiet(this, view);
  }
}

/** The module is shutting down: pending acquisitions are rejected and new ones refused. */
export class RedisLockShutdownError extends RedisLockError {
  constructor(
    /** The lock key, without the module's `keyPrefix`. */
    readonly key: string,
    /** How the key is shown (the module's `logKeys`). */
    view: KeyView = quoteKey,
  ) {
    super(
      `Lock ${view(key)} cannot be acquired: the RedisLockModule is shutting down. ` +
        `Stop starting locked work once shutdown has begun.`,
    );
    keepKeyQuiet(this, view);
  }
}

/**
 * A leadership was given up: its `stop()` was called, or the module is shutting down. The current
 * term's `signal` aborts with this error as its `reason`; the term's work should wind up and
 * return, after which the lock is released at once for the next leader.
 */
export class LeadershipStoppedError extends RedisLockError {
  constructor(
    /** The leadership's key, without the module's `keyPrefix`. */
    readonly key: string,
    /** What ended it. */
    readonly by: 'stop' | 'shutdown',
    /** How the key is shown (the module's `logKeys`). */
    view: KeyView = quoteKey,
  ) {
    super(
      by === 'stop'
        ? `Leadership of ${view(key)} was given up by stop(): finish the term's work and return.`
        : `Leadership of ${view(key)} ends: the RedisLockModule is shutting down. Finish the term's work and return.`,
    );
    keepKeyQuiet(this, view);
  }
}

/**
 * `Leadership.elected({ timeout })`: this instance did not become leader within `timeout`. Only
 * the wait ends: the campaign goes on.
 */
export class LeaderElectionTimeoutError extends RedisLockError {
  constructor(
    /** The leadership's key, without the module's `keyPrefix`. */
    readonly key: string,
    /** The `timeout` waited, in ms. */
    readonly timeout: number,
    /** How the key is shown (the module's `logKeys`). */
    view: KeyView = quoteKey,
  ) {
    super(
      `Not elected leader of ${view(key)} within ${timeout} ms: another instance leads, or Redis cannot be reached. The campaign goes on: call elected() again to wait longer, or stop() to give up.`,
    );
    keepKeyQuiet(this, view);
  }
}

/** What the library asked Redis to do when it failed. */
export type LockOperation =
  | 'acquire'
  | 'extend'
  | 'release'
  | 'isLocked'
  /** A read of an election: `LockService.leader()`, `participants()`. */
  | 'inspect'
  /** `LockService.forceRelease()`. */
  | 'forceRelease'
  /** A campaign's record of its term and its stay (internal: its failures are logged). */
  | 'campaign'
  /** The check of held locks after a reconnection (internal: its failures are never thrown). */
  | 'verify';

/**
 * Redis failed to answer a lock command: the connection is down, no reply came within the
 * module's `commandTimeout`, or a script failed. The lock state is unknown for this call; the
 * original error is the `cause`.
 */
export class LockBackendError extends RedisLockError {
  constructor(
    /** The lock key, without the module's `keyPrefix`. */
    readonly key: string,
    /** The command that failed. */
    readonly operation: LockOperation,
    cause: unknown,
    /** True when Redis did not answer within `commandTimeout` (rather than answering with an error). */
    readonly timedOut = false,
    /** How the key is shown (the module's `logKeys`). */
    view: KeyView = quoteKey,
  ) {
    super(
      `Redis failed during ${operation} of lock ${view(key)}: ${causeText(cause)}. ` +
        `Check that Redis is reachable; the call may be retried.`,
      { cause },
    );
    keepKeyQuiet(this, view);
  }
}

/**
 * With `replicaAck`: fewer replicas than asked for confirmed a lock write in time. An acquisition
 * was undone (the lock is not held); an extension was made on the master but is not known to be
 * on enough replicas. A `LockBackendError` with `operation` 'acquire' or 'extend'.
 */
export class LockReplicationError extends LockBackendError {
  constructor(
    key: string,
    operation: 'acquire' | 'extend',
    /** Replicas that had to confirm. */
    readonly replicas: number,
    /** Replicas that did. */
    readonly acknowledged: number,
    /** How long they were given, in ms. */
    readonly timeout: number,
    view?: KeyView,
  ) {
    super(
      key,
      operation,
      new Error(
        `${acknowledged} of ${replicas} replicas confirmed the write within replicaAck.timeout (${timeout} ms)`,
      ),
      false,
      view,
    );
  }
}

/**
 * Redlock mode: too few nodes answered for a majority to decide (they are down, paused or slow),
 * so the lock state is unknown for this call. The `cause` of a `LockBackendError`; `failures`
 * says what happened on each node that did not answer.
 */
export class LockQuorumError extends RedisLockError {
  constructor(
    /** Nodes in the deployment. */
    readonly nodes: number,
    /** Nodes that must agree: a majority. */
    readonly quorum: number,
    /** Nodes that answered. */
    readonly answered: number,
    /** `node <index>: <what went wrong>` for each node that did not answer. */
    readonly failures: readonly string[],
    /**
     * Whether a node that did not answer was silent past `commandTimeout` (rather than failing
     * with an error): the `timedOut` of the `LockBackendError` this is the cause of.
     */
    readonly timedOut = false,
  ) {
    super(
      `only ${answered} of ${nodes} Redis nodes answered and ${quorum} must agree (${failures.join('; ')})`,
    );
  }
}

/**
 * How a value is shown in a message: short, and never a secret (owner tokens, URL passwords).
 * Without `propertyNames`, an object's are only counted (they may come from a request, and the
 * module's `logKeys` keeps what requests put in keys out of messages).
 */
function describe(value: unknown, name?: string, propertyNames = true): string {
  if (name === 'token' && typeof value === 'string')
    return `a string of ${value.length} characters`;
  if (typeof value === 'string') {
    const safe = withoutSecrets(value) as string;
    const shown = safe.length > 80 ? `${safe.slice(0, 60)}… (${safe.length} characters)` : safe;
    return quoted(shown);
  }
  if (typeof value === 'number' || typeof value === 'boolean' || value == null) {
    return String(value);
  }
  if (typeof value === 'bigint') return `${value}n`;
  if (typeof value === 'symbol') return value.toString();
  if (typeof value === 'function') {
    const kind = /^class[\s{]/.test(Function.prototype.toString.call(value))
      ? 'the class'
      : 'a function';
    return value.name ? `${kind} ${value.name}` : kind;
  }
  if (Array.isArray(value)) return `an array of ${value.length}`;
  const proto: unknown = Object.getPrototypeOf(value);
  if (proto === Object.prototype || proto === null) {
    const keys = Object.keys(value);
    if (keys.length === 0) return 'an empty object';
    if (!propertyNames)
      return `an object with ${keys.length} ${keys.length === 1 ? 'property' : 'properties'}`;
    // The names may come from a request body: quoted (no line breaks) and cut short.
    const names = keys
      .slice(0, 5)
      .map((key) => quoted(key.length > 30 ? `${key.slice(0, 30)}…` : key));
    return `an object with ${names.join(', ')}${keys.length > 5 ? ', …' : ''}`;
  }
  // The class's own name, from its prototype (never a property the data may carry itself).
  const type: unknown = (proto as { constructor?: { name?: unknown } } | null)?.constructor?.name;
  return typeof type === 'string' && /^[\w$]{1,60}$/.test(type)
    ? `an instance of ${type}`
    : 'an object';
}

/** A string a placeholder resolved to that is no key part, described without its text (request data). */
function unkeyedString(value: string): string {
  return value.length === 0
    ? 'an empty string'
    : `a string of ${value.length} characters that is not well-formed Unicode (a lone UTF-16 surrogate)`;
}

/** ` (the value)` after an option's name, or nothing when it was not given (`undefined`). */
function given(value: unknown, name?: string): string {
  return value === undefined ? '' : ` (${describe(value, name)})`;
}

/** A cause's message, without its own final period (the sentence around it ends with one). */
function causeText(cause: unknown): string {
  return (cause instanceof Error ? cause.message : String(cause)).replace(/\.+$/, '');
}

/** Words that mark a string as possibly holding a credential. */
const SECRET_HINT = /:\/|@|pass|pwd|auth|secret/i;
/** Option names whose values are credentials. */
const SECRET_NAMES = /pass|secret|token|auth/i;

/**
 * `value` with no credential left in it: a string that may hold one (a connection string, even a
 * mistyped one) becomes its scheme and host if it parses as a URL, else a description of its
 * length; an object's (or array's) credential fields become `'***'`, one level down for nested
 * options (`sentinels`, `redisOptions`, `nodes`).
 */
function withoutSecrets(value: unknown, depth = 0): unknown {
  if (typeof value === 'string') {
    if (!SECRET_HINT.test(value)) return value;
    try {
      const url = new URL(value);
      if (url.hostname) return `${url.protocol}//${url.host}`;
    } catch {
      // Not a URL: described below.
    }
    return `a string of ${value.length} characters, not shown: it may hold a password`;
  }
  if (depth > 2 || typeof value !== 'object' || value === null) return value;
  if (Array.isArray(value)) return value.map((item: unknown) => withoutSecrets(item, depth + 1));
  if (Object.getPrototypeOf(value) !== Object.prototype) return value; // a client, a class
  return Object.fromEntries(
    Object.entries(value).map(([name, field]) => [
      name,
      SECRET_NAMES.test(name) && field !== undefined ? '***' : withoutSecrets(field, depth + 1),
    ]),
  );
}
