import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import { Redis } from 'ioredis';
import {
  getCurrentLock,
  LockAcquireTimeoutError,
  LockBackendError,
  LockLostError,
  type LockService,
} from '../../lib/index.js';
import {
  eventually,
  LogCapture,
  sleep,
  startLockModule,
  uniqueKey,
  type LockModuleFixture,
} from '../support/lock-module.js';
import { EXTEND_SCRIPT, RELEASE_SCRIPT } from '../../lib/redis/lock.scripts.js';
import { FaultProxy } from '../support/fault-proxy.js';
import { monitorRedis, scriptCalls } from '../support/redis-monitor.js';
import { startRedis, type RedisServer } from '../support/redis-server.js';
import { assertWithin, watchStalls } from '../support/timing.js';

describe('the lease of a held lock', () => {
  let server: RedisServer;
  let fixture: LockModuleFixture;
  let other: LockModuleFixture;
  let locks: LockService;
  let redis: Redis;

  before(async () => {
    server = await startRedis();
    fixture = await startLockModule({ connection: server.url });
    other = await startLockModule({ connection: server.url });
    locks = fixture.locks;
    redis = new Redis(server.port, '127.0.0.1');
  });
  after(async () => {
    await fixture?.close();
    await other?.close();
    redis?.disconnect();
    await server?.stop();
  });

  /** Lets Redis refuse ('-') or run ('+') every lock script (ACL on the default user). */
  const scripts = async (rule: '-' | '+'): Promise<void> => {
    await redis.acl('SETUSER', 'default', `${rule}evalsha`, `${rule}eval`);
  };

  describe('auto-extension', () => {
    it('using() keeps the lock alive well past its TTL while the work runs', async () => {
      const key = uniqueKey();
      const result = await locks.using(
        key,
        async (lock) => {
          // Two TTLs and more. The TTL leaves a loaded machine's stalls room: the watchdog extends
          // at a third of it, so a stall of over half a second would still be survived.
          await sleep(2_200);
          assert.equal(lock.signal.aborted, false);
          assert.equal(await redis.get(`lock:{${key}}`), lock.token);
          assert.equal(await other.locks.tryAcquire(key), null);
          return 'done';
        },
        { ttl: 1_000 },
      );
      assert.equal(result, 'done');
      assert.equal(await redis.exists(`lock:{${key}}`), 0, 'released afterwards');
    });

    it('acquire() does not auto-extend unless asked, and does when asked', async () => {
      const plain = await locks.acquire(uniqueKey(), { ttl: 1_000 });
      const extended = await locks.acquire(uniqueKey(), { ttl: 1_000, autoExtend: true });
      await sleep(1_100); // after the plain lock's lease: its expiry timer fires before this one
      assert.equal(plain.signal.aborted, true);
      assert.equal(extended.signal.aborted, false);
      assert.ok(extended.expiresAt > performance.now());
      assert.equal(await extended.release(), true);
      await plain.release();
    });

    it('using() with autoExtend: false lets the lock expire under slow work', async () => {
      const key = uniqueKey();
      await locks.using(
        key,
        async (lock) => {
          await sleep(300);
          assert.equal(lock.signal.aborted, true);
          assert.equal((lock.signal.reason as LockLostError).reason, 'expired');
        },
        { ttl: 150, autoExtend: false },
      );
    });

    it('an unextended lock ends its lease before Redis lets anyone else in: the TTL less 1 % and 2 ms', async () => {
      const key = uniqueKey();
      const sentAt = performance.now();
      const lock = await locks.acquire(key, { ttl: 6_000 });
      const acquiredAt = performance.now();
      const watch = watchStalls();
      const aborted = new Promise<number>((resolve) =>
        lock.signal.addEventListener('abort', () => resolve(performance.now()), { once: true }),
      );
      const abortedAt = await aborted;
      // Read at once: the key is still there, and still ours, with the margin left on its TTL.
      const [pttl, owner] = await Promise.all([
        redis.pttl(`lock:{${key}}`),
        redis.get(`lock:{${key}}`),
      ]);
      const stalled = watch.stop();
      assert.equal((lock.signal.reason as LockLostError).reason, 'expired');
      // The lease: 6,000 - 60 - 2 = 5,938 ms from when the command was sent (between `sentAt`
      // and `acquiredAt` here), and never over before that (see the lock-service spec's
      // early-timer test).
      assert.ok(lock.expiresAt <= acquiredAt + 5_938, 'the lease ends 62 ms before the TTL');
      assert.ok(abortedAt - sentAt >= 5_938, `aborted after ${(abortedAt - sentAt).toFixed(1)} ms`);
      // Left on the key: about the margin (62 ms), plus the acquire command's trip to Redis, less
      // the expiry timer's lateness and the read's trip, which this process's stalls lengthen.
      // Without the margin it is the trip alone, a few ms.
      assert.ok(
        pttl + stalled >= 32 && pttl <= 120,
        `the key had ${pttl} ms left when the signal aborted (event loop stalled ${stalled.toFixed(0)} ms)`,
      );
      if (pttl > 0) assert.equal(owner, lock.token);
      await lock.release();
    });

    it('keeps the lock on a link whose round trip is longer than ttl / 3, with no spurious abort', async () => {
      const proxy = await FaultProxy.start(() => server.port);
      // Each way: a 630 ms round trip, longer than ttl / 3 (600 ms) of the 1,800 ms TTL below.
      // Extensions then go back to back, each confirmed ttl - 2 round trips (540 ms) before the
      // lease would run out: room for a loaded machine's hiccups.
      proxy.setLatency(315);
      // A first call on a new connection takes three round trips (ready check, script load).
      const slow = await startLockModule({
        connection: `redis://127.0.0.1:${proxy.port}`,
        commandTimeout: 2_000,
      });
      try {
        // Warm the connection: on the first call the three round trips alone outlast the TTL.
        await (await slow.locks.acquire(uniqueKey())).release();
        const lock = await slow.locks.acquire(uniqueKey(), { ttl: 1_800, autoExtend: true });
        await sleep(3_000);
        assert.equal(lock.signal.aborted, false, String(lock.signal.reason));
        assert.equal(await redis.get(`lock:{${lock.key}}`), lock.token);
        assert.equal(await lock.release(), true);
      } finally {
        await slow.close();
        await proxy.close();
      }
    });

    it('an extension to a shorter TTL that gets no answer shortens the lease all the same: Redis may have applied it (found by the model suite)', async () => {
      const proxy = await FaultProxy.start(() => server.port);
      const cut = await startLockModule({
        connection: `redis://127.0.0.1:${proxy.port}`,
        commandTimeout: 300,
      });
      try {
        const lock = await cut.locks.acquire(uniqueKey(), { ttl: 30_000, autoExtend: false });
        // Watched from the start: its expiry timer, set for 30 s, must follow the shorter lease.
        const signal = lock.signal;
        // The link cut: the extension to 200 ms waits in the proxy, and lands when it heals.
        proxy.stall();
        const sentAt = performance.now();
        await assert.rejects(lock.extend(200), LockBackendError);
        proxy.heal();
        assert.ok(
          lock.expiresAt <= sentAt + 200,
          `the lease still ends in ${(lock.expiresAt - performance.now()).toFixed(0)} ms`,
        );
        assert.ok(await eventually(() => signal.aborted, 1_000), 'the signal did not abort');
        assert.ok(signal.reason instanceof LockLostError);
        assert.ok(await eventually(async () => (await redis.exists(`lock:{${lock.key}}`)) === 0));
      } finally {
        await cut.close();
        await proxy.close();
      }
    });

    it('the watchdog is stopped by release: no extension is sent afterwards (seen with MONITOR), nothing re-creates the key', async () => {
      const key = uniqueKey();
      const monitor = await monitorRedis(server.port);
      try {
        const lock = await locks.acquire(key, { ttl: 600, autoExtend: true });
        const extensions = () => scriptCalls(monitor.commands, EXTEND_SCRIPT, `lock:{${key}}`);
        assert.ok(await eventually(() => extensions() >= 1, 1_000), 'the watchdog extends it');
        await lock.release();
        const sent = extensions();
        await sleep(700); // past the TTL, two watchdog periods
        assert.equal(extensions(), sent, 'an extension was sent after the release');
        assert.equal(await redis.exists(`lock:{${key}}`), 0);
        assert.equal(lock.signal.aborted, false, 'release is not a loss');
      } finally {
        monitor.stop();
      }
    });
  });

  describe('losing the lock', () => {
    it('aborts the signal with LockLostError when the key is deleted under the holder', async () => {
      const key = uniqueKey();
      await locks.using(
        key,
        async (lock) => {
          await redis.del(`lock:{${key}}`);
          // The next extension (a third into the TTL) finds it gone, long before the lease ends.
          assert.ok(await eventually(() => lock.signal.aborted, 3_000));
          const reason = lock.signal.reason as LockLostError;
          assert.ok(reason instanceof LockLostError);
          assert.equal(reason.reason, 'not-held');
          assert.equal(reason.token, lock.token);
          assert.equal(await redis.exists(`lock:{${key}}`), 0, 'the watchdog never re-creates it');
        },
        { ttl: 1_000 },
      );
    });

    it('aborts the signal when someone else has taken the key, and leaves their lock alone', async () => {
      const key = uniqueKey();
      await locks.using(
        key,
        async (lock) => {
          await redis.del(`lock:{${key}}`);
          const thief = await other.locks.acquire(key, { ttl: 5_000 });
          assert.ok(await eventually(() => lock.signal.aborted, 3_000));
          assert.ok(thief.fence > lock.fence);
          await sleep(50);
          assert.equal(await redis.get(`lock:{${key}}`), thief.token);
          await thief.release();
        },
        { ttl: 300 },
      );
    });

    it('a signal is one object: read before the loss, it is the one that aborts', async () => {
      const lock = await locks.acquire(uniqueKey(), { ttl: 30_000 });
      const first = lock.signal;
      assert.equal(lock.signal, first);
      await redis.del(`lock:{${lock.key}}`);
      await assert.rejects(lock.extend(), LockLostError);
      assert.equal(first.aborted, true);
      assert.equal(lock.signal, first);
      assert.equal((first.reason as LockLostError).reason, 'not-held');
    });

    it('an extension whose answer comes after the lease ran out is a loss (expired), not an extension', async () => {
      const proxy = await FaultProxy.start(() => server.port);
      const slow = await startLockModule({ connection: `redis://127.0.0.1:${proxy.port}` });
      try {
        const lock = await slow.locks.acquire(uniqueKey(), { ttl: 300 });
        proxy.setLatency(200); // each way: the answer comes after the 295 ms lease has run out
        const error = await lock.extend(5_000).catch((e: unknown) => e);
        assert.ok(error instanceof LockLostError, String(error));
        assert.equal(error.reason, 'expired');
        assert.equal(lock.signal.aborted, true);
        proxy.setLatency(0);
      } finally {
        await slow.close();
        await proxy.close();
      }
    });

    it('an extension in flight when release() is called resolves (Redis extended it first), or fails with LockLostError if the key was gone; no event after the release', async () => {
      const key = uniqueKey();
      const events: string[] = [];
      const subscription = locks.events.subscribe((event) => {
        if (event.key === key) events.push(event.type);
      });
      try {
        const lock = await locks.acquire(key, { ttl: 30_000 });
        void lock.signal; // watched: an extension would arm its expiry timer
        const extended = lock.extend(10_000);
        assert.equal(await lock.release(), true);
        await extended;
        assert.deepEqual(events, ['acquired', 'released']);
        assert.equal(lock.signal.aborted, false, 'release is not a loss');

        const gone = await locks.acquire(key, { ttl: 30_000 });
        await redis.del(`lock:{${key}}`);
        const refused = gone.extend(10_000).catch((e: unknown) => e);
        assert.equal(await gone.release(), false);
        const error = await refused;
        assert.ok(error instanceof LockLostError, String(error));
        assert.equal(error.reason, 'not-held');
      } finally {
        subscription.unsubscribe();
      }
    });

    it('aborts with reason "unconfirmed" when Redis stops answering before the TTL runs out', async () => {
      const frozen = await startRedis();
      const app = await startLockModule({ connection: frozen.url });
      try {
        const lock = await app.locks.acquire(uniqueKey(), { ttl: 500, autoExtend: true });
        const watch = watchStalls();
        const frozenAt = performance.now();
        frozen.signal('SIGSTOP');
        assert.ok(await eventually(() => lock.signal.aborted, 5_000));
        const noticed = performance.now() - frozenAt;
        assert.equal((lock.signal.reason as LockLostError).reason, 'unconfirmed');
        // Redis never answers while frozen: the expiry timer ends it, at the lease's end.
        assertWithin(noticed, 500, watch, 'the abort after Redis froze');
        watch.stop();
        frozen.signal('SIGCONT');
        await lock.release();
      } finally {
        frozen.signal('SIGCONT');
        await app.close();
        await frozen.stop();
      }
    });
  });

  describe('failing extensions', () => {
    it('keep being retried every ttl / 10 with one warning per outage, and end as "unconfirmed" at the TTL', async () => {
      const key = uniqueKey();
      const { capture, restore } = LogCapture.install();
      try {
        const watch = watchStalls();
        const lock = await locks.acquire(key, { ttl: 1_000, autoExtend: true });
        // Every extension now fails (Redis refuses scripts) instead of answering "not held"; the
        // ACL log counts each refused attempt.
        await scripts('-');
        await redis.acl('LOG', 'RESET');
        assert.ok(await eventually(() => lock.signal.aborted, 3_000));
        assert.equal((lock.signal.reason as LockLostError).reason, 'unconfirmed');
        const warnings = capture.lines.filter((line) => line.message.includes('Could not extend'));
        assert.equal(warnings.length, 1, `${warnings.length} warnings for one outage`);
        // The first at a third of the lease (~333 ms), then every 100 ms until the lease ends
        // (~988 ms): 7 attempts. A loaded machine's stalls cost some, never add any; every
        // ttl / 5 would be 4, no retry 1.
        const log = (await redis.acl('LOG')) as (string | number)[][];
        const attempts = log
          .map((entry) => new Map(entry.flatMap((v, i) => (i % 2 ? [] : [[v, entry[i + 1]]]))))
          .filter((entry) => entry.get('object') === 'evalsha')
          .reduce((sum, entry) => sum + Number(entry.get('count')), 0);
        const lost = Math.ceil(watch.stop() / 100);
        assert.ok(
          attempts <= 7 && attempts >= 6 - lost,
          `${attempts} extension attempts in a 1 s lease (event loop stalled up to ${lost * 100} ms)`,
        );
      } finally {
        restore();
        await scripts('+');
        await redis.del(`lock:{${key}}`);
      }
    });
  });

  describe('the watchdog and release', () => {
    it('a watchdog extension that fails after the lock was released is no outage: nothing warned, nothing retried (found by mutation testing)', async () => {
      const proxy = await FaultProxy.start(() => server.port);
      const app = await startLockModule({
        connection: `redis://127.0.0.1:${proxy.port}`,
        commandTimeout: 1_000,
      });
      const monitor = await monitorRedis(server.port);
      const { capture, restore } = LogCapture.install();
      try {
        // Loaded: a held NOSCRIPT would be answered by ioredis sending the script again.
        for (const script of [EXTEND_SCRIPT, RELEASE_SCRIPT]) await redis.script('LOAD', script);
        const key = uniqueKey();
        // Its watchdog extends it a third into its lease, 1 s on; the release below goes out
        // well within that extension's commandTimeout (1 s).
        const lock = await app.locks.acquire(key, { ttl: 3_000, autoExtend: true });
        proxy.holdReplies();
        const extensions = (): number =>
          scriptCalls(monitor.commands, EXTEND_SCRIPT, `lock:{${key}}`);
        assert.ok(await eventually(() => extensions() === 1, 3_000), 'no extension sent');
        // The extension is on its way (its answer held): released meanwhile. Both go unanswered.
        await assert.rejects(lock.release(), LockBackendError);
        await sleep(200); // the extension, sent before the release, has timed out too
        proxy.heal();
        await sleep(500); // a retry would come ttl / 10 (300 ms) after the failure
        await monitor.caughtUp();
        assert.equal(
          extensions(),
          1,
          `the watchdog retried after the release: ${monitor.commands
            .filter(({ args }) => args.includes(`lock:{${key}}`))
            .map(({ args }) => `${args[0]} ${args[1].slice(0, 8)}`)
            .join(', ')}`,
        );
        const warnings = capture.lines.filter((line) => line.message.includes('Could not extend'));
        assert.deepEqual(warnings, [], 'an outage warned of for a released lock');
      } finally {
        restore();
        monitor.stop();
        await app.close();
        await proxy.close();
      }
    });
  });

  describe('using()', () => {
    it('returns the result of fn, sync or async', async () => {
      assert.equal(await locks.using(uniqueKey(), () => 42), 42);
      assert.deepEqual(await locks.using(uniqueKey(), async () => ({ ok: true })), { ok: true });
    });

    it('rethrows the error of fn unchanged and still releases', async () => {
      const key = uniqueKey();
      class DomainError extends Error {}
      const thrown = new DomainError('insufficient funds');
      const caught = await locks
        .using(key, () => {
          throw thrown;
        })
        .catch((e: unknown) => e);
      assert.equal(caught, thrown);
      assert.equal(await redis.exists(`lock:{${key}}`), 0);
    });

    it('a failed release is logged, never thrown over the result', async () => {
      const key = uniqueKey();
      const { capture, restore } = LogCapture.install();
      try {
        const result = await locks.using(
          key,
          async () => {
            // Make the release script fail (Redis refuses it) rather than return 0.
            await scripts('-');
            return 'kept';
          },
          { autoExtend: false },
        );
        assert.equal(result, 'kept');
        assert.ok(
          capture.lines.some((line) => line.level === 'error' && line.message.includes(key)),
        );
      } finally {
        restore();
        await scripts('+');
        await redis.del(`lock:{${key}}`);
      }
    });

    it('logs a warning when the lock was lost while the work ran', async () => {
      const key = uniqueKey();
      const { capture, restore } = LogCapture.install();
      try {
        await locks.using(
          key,
          async (lock) => {
            await redis.del(`lock:{${key}}`);
            await eventually(() => lock.signal.aborted, 1_000);
          },
          { ttl: 300 },
        );
        const warned = capture.lines.filter(
          (line) => line.level === 'warn' && line.message.includes(key),
        );
        assert.equal(warned.length, 1, JSON.stringify(warned));
        assert.match(
          warned[0].message,
          /^Lock ".*" \(fence \d+\): lost before the work finished: LockLostError/,
        );
      } finally {
        restore();
      }
    });
  });

  describe('re-entrancy within one call chain', () => {
    it('nested using() of the same key re-enters instead of deadlocking', async () => {
      const key = uniqueKey();
      const fences = await locks.using(key, async (outer) =>
        locks.using(
          key,
          async (inner) => {
            assert.equal(inner.token, outer.token);
            return [outer.fence, inner.fence];
          },
          { acquireTimeout: 0 },
        ),
      );
      assert.equal(fences[0], fences[1]);
      assert.equal(await redis.exists(`lock:{${key}}`), 0, 'released when the outermost use ends');
    });

    it('the inner release does not free the outer lock', async () => {
      const key = uniqueKey();
      await locks.using(key, async (outer) => {
        const inner = await locks.acquire(key, { acquireTimeout: 0 });
        assert.equal(await inner.release(), true);
        assert.equal(await redis.get(`lock:{${key}}`), outer.token);
        assert.equal(await other.locks.tryAcquire(key), null);
      });
    });

    it('unrelated concurrent calls in the same process still exclude each other', async () => {
      const key = uniqueKey();
      const held = await new Promise<() => void>((resolveHeld) => {
        void locks.using(key, () => new Promise<void>((done) => resolveHeld(done)));
      });
      await assert.rejects(
        locks.using(key, () => 'second', { acquireTimeout: 200 }),
        LockAcquireTimeoutError,
      );
      held();
    });

    it('sibling branches forked inside another lock do not share a lock they each take', async () => {
      const outerKey = uniqueKey('outer');
      const key = uniqueKey('inner');
      let inside = 0;
      let maxInside = 0;
      await locks.using(outerKey, () =>
        Promise.all(
          [1, 2, 3].map(() =>
            locks.using(key, async () => {
              maxInside = Math.max(maxInside, ++inside);
              await sleep(30);
              inside--;
            }),
          ),
        ),
      );
      assert.equal(maxInside, 1);
    });

    it('does not cross LockService instances (two apps in one process)', async () => {
      const key = uniqueKey();
      await locks.using(key, async () => {
        assert.equal(await other.locks.tryAcquire(key), null);
      });
    });

    it('getCurrentLock() exposes the lock held by the chain', async () => {
      const a = uniqueKey('a');
      const b = uniqueKey('b');
      assert.equal(getCurrentLock(), undefined);
      await locks.using(a, async (lockA) => {
        assert.equal(getCurrentLock(), lockA);
        await locks.using(b, async (lockB) => {
          assert.equal(getCurrentLock(), lockB);
          assert.equal(getCurrentLock(a), lockA);
        });
        assert.equal(getCurrentLock(), lockA);
        await lockA.release(); // released inside its chain: no longer the chain's lock
        assert.equal(getCurrentLock(), undefined);
        assert.equal(getCurrentLock(a), undefined);
      });
      assert.equal(getCurrentLock(), undefined);
    });

    it('re-entering a lock that was lost fails with LockLostError', async () => {
      const key = uniqueKey();
      await locks.using(
        key,
        async (lock) => {
          await redis.del(`lock:{${key}}`);
          await eventually(() => lock.signal.aborted, 1_000);
          await assert.rejects(
            locks.using(key, () => 'inner'),
            LockLostError,
          );
        },
        { ttl: 300 },
      );
    });
  });
});
