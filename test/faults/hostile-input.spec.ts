/**
 * Hostile input, property-based (fast-check), over the public API against real Redis: every
 * input either works as documented or throws a RedisLockError subclass naming it. Nothing hangs,
 * crashes, leaves a key without a TTL or outside the prefix, lets one caller release or extend
 * another's lock, or writes an owner token into a log line or an error message.
 */
import assert from 'node:assert/strict';
import { after, afterEach, before, describe, it } from 'node:test';
import fc from 'fast-check';
import { Cluster, Redis } from 'ioredis';
import {
  LockAcquireAbortedError,
  LockAcquireTimeoutError,
  LockArgumentError,
  LockKeyResolutionError,
  LockLostError,
  RedisLockConfigurationError,
  type AcquireOptions,
  type Lock,
  type LockService,
} from '../../lib/index.js';
import { compileLockKey } from '../../lib/decorators/lock-key.resolver.js';
import { MAX_DURATION } from '../../lib/options/defaults.js';
import { resolveModuleOptions } from '../../lib/options/module-options.js';
import {
  LogCapture,
  startLockModule,
  uniqueKey,
  type LockModuleFixture,
} from '../support/lock-module.js';
import {
  startCluster,
  startRedis,
  type RedisClusterFixture,
  type RedisServer,
} from '../support/redis-server.js';

const PREFIX = 'fuzz:';
/** No call may take longer than this, whatever its input (commandTimeout is 1 s). */
const CALL_BOUND = 3_000;

// --- Oracles, written independently of the library's own validation. ---
const isWholeMs = (v: unknown): v is number =>
  typeof v === 'number' && Number.isInteger(v) && v <= MAX_DURATION;
/** At least MIN_TTL (10 ms): a lock's lease is its TTL less 1 % and 2 ms. */
const validTtl = (v: unknown): boolean => isWholeMs(v) && v >= 10;
const validTimeout = (v: unknown): boolean => isWholeMs(v) && v >= 0;
/**
 * A lease shorter than an event-loop stall of a loaded machine (a CI host's ticks reach a few
 * hundred ms): its grant may arrive after it ran out, which the README counts as a failed attempt
 * (the caller never gets a lock whose lease is over), so a call with it may time out, and a
 * `using()` section may outlive it.
 */
const SHORT_LEASE = 1_000;
/** The module's maxKeyLength, by default. */
const MAX_KEY_LENGTH = 512;
const validKey = (k: unknown): k is string =>
  typeof k === 'string' && k.length > 0 && k.length <= MAX_KEY_LENGTH && !/\p{Surrogate}/u.test(k);

// --- Arbitraries. ---
const hostileDuration = fc.oneof(
  fc.constantFrom<unknown>(
    Number.NaN,
    Infinity,
    -Infinity,
    0,
    -0,
    -1,
    0.5,
    1.5,
    MAX_DURATION,
    MAX_DURATION + 1,
    Number.MAX_SAFE_INTEGER,
    1e300,
    '100',
    '',
    null,
    true,
    {},
    [],
    10n,
  ),
  fc.integer({ min: -10, max: 60_000 }),
  fc.double(),
  fc.string({ maxLength: 4 }),
);
const hostileKey = fc.oneof(
  fc.constantFrom<unknown>(
    '',
    '*',
    '{',
    '}',
    '}x',
    '{}',
    'a}b{c',
    '%',
    '%7D',
    '%25',
    '\n',
    'a\r\n*3\r\n$3\r\nDEL',
    '\0',
    'nul\0inside',
    '😀',
    '\uD800',
    'x\uDC00y',
    'k'.repeat(512),
    'k'.repeat(513),
    'k'.repeat(20_000),
    ' ',
  ),
  fc.string({ unit: 'binary', minLength: 1, maxLength: 12 }),
  fc.string({ unit: 'grapheme', maxLength: 8 }),
  fc.anything(),
);
const notAList = hostileKey.filter((key) => !Array.isArray(key));
/** Tokens long and random enough that finding one in a message can only mean it leaked. */
const secretToken = fc.string({
  unit: fc.constantFrom(...'0123456789abcdefghijklmnopqrstuvwxyz'),
  minLength: 24,
  maxLength: 40,
});
const ACQUIRE_KEYS = [
  'ttl',
  'acquireTimeout',
  'autoExtend',
  'signal',
  'token',
  'limit',
  'mode',
  'fair',
] as const;
const optionValue = fc.oneof(
  hostileDuration,
  fc.boolean(),
  secretToken,
  fc.constantFrom('read', 'write', 'READ'),
  fc.integer({ min: -1, max: 4 }),
  fc.anything(),
);
const hostileOptions = fc.oneof(
  fc.dictionary(fc.oneof(fc.constantFrom<string>(...ACQUIRE_KEYS), fc.string()), optionValue, {
    maxKeys: 4,
  }),
  fc.record(
    {
      ttl: fc.oneof(fc.integer({ min: 50, max: 60_000 }), hostileDuration),
      acquireTimeout: fc.oneof(fc.integer({ min: 0, max: 200 }), hostileDuration),
      autoExtend: fc.oneof(fc.boolean(), fc.anything()),
      token: fc.oneof(secretToken, fc.anything()),
    },
    { requiredKeys: [] },
  ),
  fc.constantFrom<unknown>(null, 5, 'ttl', [], [1], true),
);

/** Settles like `promise`, or fails the property if it takes longer than CALL_BOUND. */
async function bounded<T>(promise: Promise<T>, what: string): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const hang = new Promise<never>((_, reject) => {
    timer = setTimeout(
      () => reject(new Error(`${what} did not settle in ${CALL_BOUND} ms`)),
      CALL_BOUND,
    );
  });
  try {
    return await Promise.race([promise, hang]);
  } finally {
    clearTimeout(timer);
  }
}

async function outcome<T>(
  promise: Promise<T>,
  what: string,
): Promise<{ value?: T; error?: unknown }> {
  try {
    return { value: await bounded(promise, what) };
  } catch (error) {
    if (error instanceof Error && error.message.endsWith(`did not settle in ${CALL_BOUND} ms`))
      throw error;
    return { error };
  }
}

describe('hostile input (property-based)', () => {
  let server: RedisServer;
  let redis: Redis;
  let app: LockModuleFixture;
  let other: LockModuleFixture;
  let locks: LockService;
  let logs: ReturnType<typeof LogCapture.install>;
  /** Every owner token used, and every error message seen: checked against each other at the end. */
  const tokens = new Set<string>();
  const messages: string[] = [];

  const seen = (error: unknown): void => {
    if (error instanceof Error) messages.push(error.message, String(error));
  };
  const remember = (lock: Lock | null | undefined): void => {
    // A caller may pass any non-empty token, even "a"; only one long enough to be a secret can
    // be looked for in text (the library's own are 32 hex characters).
    if (lock && lock.token.length >= 16) tokens.add(lock.token);
  };

  before(async () => {
    server = await startRedis();
    redis = new Redis(server.port, server.host);
    app = await startLockModule({ connection: server.url, keyPrefix: PREFIX });
    other = await startLockModule({ connection: server.url, keyPrefix: PREFIX });
    // After the apps: compiling a testing module resets Nest's static logger.
    logs = LogCapture.install();
    locks = app.locks;
  });
  after(async () => {
    logs?.restore();
    await app?.close();
    await other?.close();
    redis?.disconnect();
    await server?.stop();
  });

  afterEach(async () => {
    // Whatever a property did: every key is inside the prefix, and none lives without a TTL.
    const keys = await redis.keys('*');
    for (const key of keys) {
      assert.ok(
        key.startsWith(`${PREFIX}{`),
        `key outside the prefix: ${JSON.stringify(key.slice(0, 80))}`,
      );
      const pttl = await redis.pttl(key);
      assert.ok(pttl > 0 || pttl === -2, `key without a TTL: ${JSON.stringify(key.slice(0, 80))}`);
    }
  });

  it('durations: a valid ttl / acquireTimeout works, anything else is a LockArgumentError naming it', async () => {
    await fc.assert(
      fc.asyncProperty(
        hostileDuration,
        hostileDuration,
        fc.constantFrom('acquire', 'tryAcquire', 'using'),
        async (ttl, acquireTimeout, method) => {
          const key = uniqueKey('d');
          const options = { ttl, acquireTimeout } as AcquireOptions;
          const { value, error } = await outcome<unknown>(
            method === 'using'
              ? locks.using(key, async (lock) => (remember(lock), lock.fence), options)
              : locks[method](key, options),
            `${method}(${String(ttl)}, ${String(acquireTimeout)})`,
          );
          seen(error);
          if (validTtl(ttl) && validTimeout(acquireTimeout)) {
            const outlived =
              (ttl as number) < SHORT_LEASE &&
              (error instanceof LockAcquireTimeoutError ||
                (error instanceof LockLostError && method === 'using') ||
                (value === null && method === 'tryAcquire'));
            if (outlived) {
              assert.ok(error === undefined || (error as { key: string }).key === key);
              return;
            }
            assert.equal(error, undefined, String(error));
            if (method !== 'using') {
              const lock = value as Lock;
              remember(lock);
              const pttl = await redis.pttl(`${PREFIX}{${key}}`);
              // -1 (no TTL) is no lock: it must have one, at most the ttl asked for.
              assert.ok(pttl > 0 && pttl <= (ttl as number), `pttl ${pttl} for ttl ${String(ttl)}`);
              await lock.release();
            }
          } else {
            assert.ok(error instanceof LockArgumentError, String(error));
            assert.equal(error.argument, validTtl(ttl) ? 'acquireTimeout' : 'ttl');
            assert.ok(Object.is(error.value, validTtl(ttl) ? acquireTimeout : ttl));
          }
        },
      ),
      { numRuns: 150 },
    );
  });

  it('extend(ttl): a valid ttl extends, anything else is a LockArgumentError and the lock is kept', async () => {
    await fc.assert(
      fc.asyncProperty(hostileDuration, async (ttl) => {
        const lock = await locks.acquire(uniqueKey('e'), { ttl: 60_000 });
        remember(lock);
        const { error } = await outcome(lock.extend(ttl as number), `extend(${String(ttl)})`);
        seen(error);
        const pttl = await redis.pttl(`${PREFIX}{${lock.key}}`);
        if (validTtl(ttl)) {
          assert.equal(error, undefined, String(error));
          assert.ok(
            pttl > 0 && pttl <= (ttl as number),
            `pttl ${pttl} after extend(${String(ttl)})`,
          );
        } else {
          assert.ok(error instanceof LockArgumentError && error.argument === 'ttl', String(error));
          assert.ok(pttl > 50_000, 'the lock keeps its TTL');
        }
        await lock.release();
      }),
      { numRuns: 100 },
    );
  });

  it('keys: any well-formed non-empty string locks exactly itself; anything else is a LockArgumentError', async () => {
    await fc.assert(
      // (An array is a key list: the next property's.)
      fc.asyncProperty(notAList, hostileKey, async (key, otherKey) => {
        const { value: lock, error } = await outcome(locks.tryAcquire(key as string), 'tryAcquire');
        seen(error);
        if (!validKey(key)) {
          assert.ok(error instanceof LockArgumentError && error.argument === 'key', String(error));
          await assert.rejects(locks.isLocked(key as string), LockArgumentError);
          return;
        }
        assert.ok(lock, `free key not acquired: ${String(error)}`);
        remember(lock);
        try {
          assert.equal(lock.key, key);
          assert.equal(await bounded(locks.isLocked(key), 'isLocked'), true);
          assert.equal(await bounded(other.locks.tryAcquire(key), 'tryAcquire'), null);
          if (validKey(otherKey) && otherKey !== key) {
            // One-to-one: no two keys share a lock, escaped or not.
            const second = await bounded(locks.tryAcquire(otherKey), 'tryAcquire other');
            assert.ok(second, `${JSON.stringify(otherKey)} was locked by ${JSON.stringify(key)}`);
            await second.release();
          }
        } finally {
          assert.equal(await bounded(lock.release(), 'release'), true);
        }
        assert.equal(await locks.isLocked(key), false);
      }),
      { numRuns: 150 },
    );
  });

  it('key lists: any list of distinct valid keys locks exactly those, all or none; anything else is a LockArgumentError that locks nothing', async () => {
    const ran = { locked: 0, busy: 0, rejected: 0 };
    await fc.assert(
      fc.asyncProperty(
        fc.array(fc.oneof(hostileKey, fc.constantFrom('a', 'b', 'c')), { maxLength: 4 }),
        fc.boolean(),
        async (list, busyFirst) => {
          const valid =
            list.length > 0 && list.every(validKey) && new Set(list).size === list.length;
          const keys = list as string[];
          // Another caller holds one of the keys: nothing may be kept.
          const busy = valid && busyFirst ? await other.locks.tryAcquire(keys[0]) : null;
          const { value: lock, error } = await outcome(locks.tryAcquire(keys), 'tryAcquire list');
          seen(error);
          remember(lock);
          try {
            if (!valid) {
              assert.ok(
                error instanceof LockArgumentError && error.argument === 'key',
                String(error),
              );
              ran.rejected++;
              return;
            }
            if (busy) {
              ran.busy++;
              assert.equal(lock, null);
              for (const key of keys.slice(1)) assert.equal(await locks.isLocked(key), false);
              return;
            }
            assert.ok(lock, `free keys not acquired: ${String(error)}`);
            assert.deepEqual(lock.keys, [...keys].sort());
            for (const key of keys) {
              assert.equal(await bounded(other.locks.tryAcquire(key), 'tryAcquire'), null);
            }
            assert.equal(await bounded(lock.release(), 'release'), true);
            for (const key of keys) assert.equal(await locks.isLocked(key), false);
            ran.locked++;
          } finally {
            await busy?.release();
          }
        },
      ),
      { numRuns: 200 },
    );
    // The generator must reach every branch, or the property proves less than it says.
    assert.ok(ran.locked > 10 && ran.busy > 10 && ran.rejected > 10, JSON.stringify(ran));
  });

  it('a key with } and % is stored as the README says', async () => {
    const lock = await locks.acquire('a}b%');
    remember(lock);
    assert.equal(await redis.get(`${PREFIX}{a%7Db%25}`), lock.token);
    assert.ok((await redis.pttl(`${PREFIX}{}:counter`)) > 0);
    await lock.release();
  });

  it('option objects: unknown or mistyped fields are a LockArgumentError naming one of them', async () => {
    await fc.assert(
      fc.asyncProperty(hostileOptions, async (options) => {
        const key = uniqueKey('o');
        const { value: lock, error } = await outcome(
          locks.acquire(key, options as AcquireOptions),
          'acquire',
        );
        seen(error);
        if (typeof options !== 'object' || options === null || Array.isArray(options)) {
          assert.ok(
            error instanceof LockArgumentError && error.argument === 'options',
            String(error),
          );
          return;
        }
        const entries = Object.entries(options as Record<string, unknown>).filter(
          ([, v]) => v !== undefined,
        );
        const bad = Object.keys(options).filter(
          (name) => !(ACQUIRE_KEYS as readonly string[]).includes(name),
        );
        for (const [name, v] of entries) {
          const ok =
            (name === 'ttl' && validTtl(v)) ||
            (name === 'acquireTimeout' && validTimeout(v)) ||
            (name === 'autoExtend' && typeof v === 'boolean') ||
            (name === 'signal' && v instanceof AbortSignal) ||
            (name === 'token' && typeof v === 'string' && v.length > 0) ||
            (name === 'limit' &&
              Number.isInteger(v) &&
              (v as number) >= 1 &&
              (v as number) <= 1e6) ||
            (name === 'mode' && (v === 'read' || v === 'write')) ||
            (name === 'fair' && typeof v === 'boolean');
          if (!ok) bad.push(name);
        }
        // Shapes that do not exist: named by both options (each checked once both are valid).
        const { limit = 1, mode = 'write', fair = false } = options as AcquireOptions;
        if (mode === 'read' && Number(limit) > 1) bad.push('mode + limit');
        if (fair === true && Number(limit) > 1) bad.push('fair + limit');
        if (fair === true && mode === 'read') bad.push('fair + mode');
        if (bad.length === 0) {
          assert.ok(lock, String(error));
          remember(lock);
          if (typeof (options as AcquireOptions).token === 'string') {
            assert.equal(lock.token, (options as AcquireOptions).token);
          }
          await lock.release();
        } else {
          assert.ok(error instanceof LockArgumentError, String(error));
          assert.ok(bad.includes(error.argument), `${error.argument} not in ${bad.join(',')}`);
        }
      }),
      { numRuns: 200 },
    );
  });

  it('one caller can never release or extend another caller’s lock', async () => {
    await fc.assert(
      fc.asyncProperty(secretToken, secretToken, async (mine, theirs) => {
        fc.pre(mine !== theirs);
        const key = uniqueKey('x');
        tokens.add(mine).add(theirs);
        const lock = (await locks.tryAcquire(key, { token: mine }))!;
        assert.ok(lock);
        // Another app, or this one with another token, cannot take it.
        assert.equal(await other.locks.tryAcquire(key, { token: theirs }), null);
        assert.equal(await locks.tryAcquire(key, { token: theirs }), null);
        // Another app cannot release or extend it through its handle, nor anyone through a copy.
        for (const attempt of [
          () => other.locks.release(lock),
          () => other.locks.extend(lock),
          () => locks.release({ ...lock }),
          () => locks.extend({ ...lock, token: theirs }),
        ]) {
          const error = await attempt().then(
            () => undefined,
            (e: unknown) => e,
          );
          seen(error);
          assert.ok(error instanceof LockArgumentError && error.argument === 'lock', String(error));
        }
        assert.equal(await redis.get(`${PREFIX}{${key}}`), mine);
        // A holder whose lock was taken over cannot release or extend the new holder's.
        await redis.set(`${PREFIX}{${key}}`, theirs, 'PX', 60_000);
        assert.equal(await lock.release(), false);
        assert.equal(await redis.get(`${PREFIX}{${key}}`), theirs);
        await redis.del(`${PREFIX}{${key}}`);
        // Work that ends without its lock logs a warning: with the key, never the token.
        await locks.using(key, async (held) => void (await held.release()), { token: mine });
        const lost = await locks.acquire(key, { token: mine, ttl: 10 });
        await new Promise((resolve) => setTimeout(resolve, 15));
        const extendError = await lost.extend().catch((e: unknown) => e);
        assert.ok(extendError instanceof LockLostError);
        seen(extendError);
        await lost.release();
      }),
      { numRuns: 40 },
    );
  });

  it('an aborted signal is a LockAcquireAbortedError, never a lock', async () => {
    const controller = new AbortController();
    controller.abort(new Error('gone'));
    await assert.rejects(
      locks.acquire(uniqueKey(), { signal: controller.signal }),
      LockAcquireAbortedError,
    );
  });

  it('key templates: a malformed template fails at definition; a bad argument is a LockKeyResolutionError, never "undefined" in a key', () => {
    const piece = fc.oneof(
      fc.constantFrom(
        '{0}',
        '{1}',
        '{0.id}',
        '{1.a.b}',
        '{0.length}',
        '{',
        '}',
        '{x}',
        '{0.}',
        '{-1}',
        '{0.constructor}',
        '{ 0}',
        ':',
      ),
      fc.string({ maxLength: 4 }),
    );
    const template = fc.array(piece, { maxLength: 5 }).map((parts) => parts.join(''));
    const argument = fc.oneof(
      fc.anything(),
      fc.record({ id: fc.anything(), a: fc.record({ b: fc.anything() }) }, { requiredKeys: [] }),
      fc.string(),
      fc.integer(),
    );
    const PLACEHOLDER = /\{(\d+)((?:\.[A-Za-z_$][\w$]*)*)\}/g;
    // A separator: neither a letter nor a digit, nor the encoding's own `%`.
    const isSeparator = (char: string): boolean => !/[\p{L}\p{N}%]/u.test(char);
    // Well-formed: only placeholders in braces, and a separator between any two of them.
    const wellFormed = (source: string): boolean =>
      /^(?:[^{}]|\{\d+(?:\.[A-Za-z_$][\w$]*)*\})+$/.test(source) &&
      source
        .split(PLACEHOLDER)
        .filter((_, i) => i % 3 === 0)
        .slice(1, -1)
        .every((between) => [...between].some(isSeparator));
    fc.assert(
      fc.property(template, fc.array(argument, { maxLength: 3 }), (source, args) => {
        let resolve: (args: readonly unknown[], maxKeyLength: number) => string | string[];
        try {
          resolve = compileLockKey(source, 'Fuzz.method');
        } catch (error) {
          assert.ok(error instanceof RedisLockConfigurationError, String(error));
          assert.ok(
            !wellFormed(source),
            `rejected a well-formed template ${JSON.stringify(source)}`,
          );
          return;
        }
        assert.ok(wellFormed(source), `accepted ${JSON.stringify(source)}`);
        // A value never writes %, braces, :, a control character or the template's separators.
        const literal = source.replace(PLACEHOLDER, '');
        const encoded = (value: string): string =>
          [...value]
            .map((char) =>
              '%{}:'.includes(char) ||
              /\p{Cc}/u.test(char) ||
              (isSeparator(char) && literal.includes(char))
                ? Buffer.from(char)
                    .toString('hex')
                    .toUpperCase()
                    .replace(/../g, (byte) => `%${byte}`)
                : char,
            )
            .join('');
        // The oracle: each placeholder must land on a non-empty string, finite number or bigint.
        let badPart = false;
        const expected = source.replace(PLACEHOLDER, (_, index: string, path: string) => {
          let value: unknown = args[Number(index)];
          for (const name of path.split('.').slice(1)) {
            // Own properties only (inherited ones are missing).
            const own =
              value !== null &&
              value !== undefined &&
              Object.prototype.hasOwnProperty.call(Object(value), name);
            value = own ? (value as Record<string, unknown>)[name] : undefined;
            if (!own) break;
          }
          const fine =
            (typeof value === 'string' && value.length > 0 && !/\p{Surrogate}/u.test(value)) ||
            (typeof value === 'number' && Number.isFinite(value)) ||
            typeof value === 'bigint';
          if (!fine) badPart = true;
          return fine ? encoded(String(value)) : '';
        });
        try {
          assert.equal(resolve(args, Infinity), expected);
          assert.ok(!badPart);
        } catch (error) {
          if (error instanceof assert.AssertionError) throw error;
          assert.ok(error instanceof LockKeyResolutionError, String(error));
          assert.ok(badPart, `rejected ${JSON.stringify(args)}`);
        }
      }),
      { numRuns: 500 },
    );
  });

  it('module options: anything but a valid set is a RedisLockConfigurationError naming an option', () => {
    const client = redis; // a real ioredis client: used for validation only, never connected twice
    const moduleOptions = fc.oneof(
      fc.dictionary(
        fc.oneof(
          fc.constantFrom(
            'client',
            'connection',
            'keyPrefix',
            'commandTimeout',
            'defaults',
            'timeoutStatus',
            'timeoutException',
            'ttl',
          ),
          fc.string(),
        ),
        fc.oneof(
          fc.constant(client),
          fc.constantFrom('redis://127.0.0.1:1', 'http://x', 'redis://', '{x}:', 409, 99),
          hostileDuration,
          fc.record(
            { ttl: hostileDuration, acquireTimeout: hostileDuration, retryJitter: hostileDuration },
            { requiredKeys: [] },
          ),
          fc.anything(),
        ),
        { maxKeys: 4 },
      ),
      fc.anything(),
    );
    fc.assert(
      fc.property(moduleOptions, (options) => {
        try {
          const resolved = resolveModuleOptions(options as never);
          // Accepted: exactly one Redis source, and every duration whole and in range.
          assert.ok(
            (resolved.source.kind === 'client') !== (resolved.source.kind === 'connection'),
          );
          assert.ok(validTtl(resolved.commandTimeout) && validTtl(resolved.defaults.ttl));
          assert.ok(validTimeout(resolved.defaults.acquireTimeout));
        } catch (error) {
          if (error instanceof assert.AssertionError) throw error;
          assert.ok(error instanceof RedisLockConfigurationError, String(error));
          assert.equal(typeof error.option, 'string');
          seen(error);
        }
      }),
      { numRuns: 500 },
    );
  });

  it('no owner token ever reached a log line or an error message', () => {
    assert.ok(tokens.size > 50, `${tokens.size} tokens seen`);
    assert.ok(messages.length > 50, `${messages.length} messages`);
    assert.ok(logs.capture.lines.length > 0, 'some lines were logged');
    const texts = [...messages, ...logs.capture.lines.map((line) => line.message)];
    for (const token of tokens) {
      for (const text of texts)
        assert.ok(!text.includes(token), `token leaked into: ${text.slice(0, 200)}`);
    }
  });
});

describe('hostile keys on Redis Cluster', () => {
  let cluster: RedisClusterFixture;
  let client: Cluster;
  let app: LockModuleFixture;

  before(async () => {
    cluster = await startCluster(3);
    client = new Cluster(cluster.nodes.map((node) => ({ host: node.host, port: node.port })));
    app = await startLockModule({ client, keyPrefix: PREFIX });
  });
  after(async () => {
    await app?.close();
    client?.disconnect();
    await cluster?.stop();
  });

  it('every valid key keeps its lock and fence in one slot (no CROSSSLOT), braces and all', async () => {
    await fc.assert(
      fc.asyncProperty(hostileKey.filter(validKey), async (key) => {
        const lock = await bounded(app.locks.acquire(key, { acquireTimeout: 0 }), 'acquire');
        assert.ok(lock.fence > 0);
        assert.equal(await bounded(lock.extend(), 'extend'), undefined);
        assert.equal(await bounded(lock.release(), 'release'), true);
      }),
      { numRuns: 60 },
    );
  });
});
