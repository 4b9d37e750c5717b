import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
import { inspect } from 'node:util';
import { after, before, describe, it } from 'node:test';
import { Injectable } from '@nestjs/common';
import { Redis } from 'ioredis';
import {
  LockAcquireTimeoutError,
  LockArgumentError,
  LockBackendError,
  LockKeyResolutionError,
  LockLostError,
  LockService,
  WithLock,
  type LockEvent,
  type LogKeys,
} from '../../lib/index.js';
import {
  LogCapture,
  eventually,
  startLockModule,
  type LockModuleFixture,
} from '../support/lock-module.js';
import { startRedis, type RedisServer } from '../support/redis-server.js';

/** A key that carries personal data, as keys built from request input do. */
const SECRET = 'alice@example.com';

/** Methods whose key parts come from their argument, as a request's body would give them. */
@Injectable()
class Carts {
  @WithLock({ key: 'cart:{0}' })
  async add(_owner: unknown): Promise<void> {}

  @WithLock({ key: (owner: unknown) => owner as string })
  async addByFunction(_owner: unknown): Promise<void> {}
}

/** What `logKeys: 'hashed'` shows for `key`: what an operator computes to find its lines. */
function hashOf(key: string): string {
  return `key#${createHash('sha256').update(key).digest('hex').slice(0, 16)}`;
}

for (const mode of ['hashed', 'hidden'] as const satisfies readonly LogKeys[]) {
  describe(`logKeys: '${mode}'`, () => {
    let server: RedisServer;
    let app: LockModuleFixture;
    let other: LockModuleFixture;
    let redis: Redis;
    let n = 0;
    const shown = (key: string): string => (mode === 'hashed' ? hashOf(key) : '(key hidden)');
    /** A fresh key with the personal data in it. */
    const keyOf = (): string => `cart:${SECRET}:${mode}:${++n}`;

    before(async () => {
      server = await startRedis();
      app = await startLockModule({ connection: server.url, logKeys: mode, maxKeyLength: 64 }, [
        Carts,
      ]);
      other = await startLockModule({ connection: server.url });
      redis = new Redis(server.url);
    });
    after(async () => {
      redis?.disconnect();
      await app?.close();
      await other?.close();
      await server?.stop();
    });

    it("errors name the key as the module shows it; the key stays on the error's key, out of inspect and JSON", async () => {
      const key = keyOf();
      const held = await other.locks.acquire(key);
      try {
        const error = await app.locks.acquire(key, { acquireTimeout: 0 }).then(
          () => assert.fail('acquired a held lock'),
          (failure: unknown) => failure,
        );
        assert.ok(error instanceof LockAcquireTimeoutError, String(error));
        assert.equal(error.key, key);
        assert.ok(error.message.includes(shown(key)), error.message);
        for (const printed of [error.message, error.stack, inspect(error), JSON.stringify(error)]) {
          assert.ok(!printed?.includes(SECRET), `the key leaked: ${printed}`);
        }
      } finally {
        await held.release();
      }
      const tooLong = `${keyOf()}:${'x'.repeat(64)}`;
      await assert.rejects(
        app.locks.acquire(tooLong),
        (error: unknown) =>
          error instanceof LockArgumentError &&
          error.message.includes(shown(tooLong)) &&
          !error.message.includes(SECRET),
      );
    });

    it("a lost lock's LockLostError names the key as the module shows it (found by mutation testing)", async () => {
      const key = keyOf();
      const lock = await app.locks.acquire(key, { ttl: 100 });
      assert.ok(await eventually(() => lock.signal.aborted, 2_000), 'never lost');
      const error = lock.signal.reason as unknown;
      assert.ok(error instanceof LockLostError, String(error));
      assert.equal(error.key, key);
      assert.ok(error.message.includes(shown(key)), error.message);
      for (const printed of [error.message, error.stack, inspect(error), JSON.stringify(error)]) {
        assert.ok(!printed?.includes(SECRET), `the key leaked: ${printed}`);
      }
      await lock.release();
    });

    it('a key part that resolved to an object is counted in the error, not named: its property names may be request data', async () => {
      const carts = app.module.get(Carts);
      for (const call of [
        () => carts.add({ [SECRET]: 1 }),
        () => carts.addByFunction({ [SECRET]: 1 }),
      ]) {
        await assert.rejects(
          call(),
          (error: unknown) =>
            error instanceof LockKeyResolutionError &&
            /resolved to an object with 1 property\./.test(error.message) &&
            !error.message.includes(SECRET),
        );
      }
    });

    it("a Redis error's cause names neither key nor token, however deep it is inspected", async () => {
      const key = keyOf();
      const token = `own-token-${mode}-secret`;
      await redis.config('SET', 'maxmemory', '1'); // every write answered OOM
      try {
        const error = await app.locks.acquire(key, { token }).then(
          () => assert.fail('acquired with no memory to write'),
          (failure: unknown) => failure,
        );
        assert.ok(error instanceof LockBackendError, String(error));
        assert.match(String(error.cause), /OOM/);
        const printed = inspect(error, { depth: 10 });
        assert.ok(!printed.includes(SECRET) && !printed.includes(token), printed);
      } finally {
        await redis.config('SET', 'maxmemory', '0');
      }
    });

    it('events carry the key as log lines show it', async () => {
      const key = keyOf();
      const seen: LockEvent[] = [];
      const subscription = app.locks.events.subscribe((event) => seen.push(event));
      try {
        await app.locks.using(key, () => undefined);
      } finally {
        subscription.unsubscribe();
      }
      assert.deepEqual(
        seen.map((event) => [event.type, event.key]),
        [
          ['acquired', shown(key)],
          ['released', shown(key)],
        ],
      );
    });

    it("a leadership's events and its health report show the key as log lines do", async () => {
      const key = keyOf();
      const seen: LockEvent[] = [];
      const subscription = app.locks.events.subscribe((event) => seen.push(event));
      const leadership = app.locks.lead(key, async () => {}); // each term ends at once
      try {
        await leadership.elected();
        const { details } = await app.locks.checkHealth();
        assert.deepEqual((details.leaderships as { key: string }[])[0].key, shown(key));
      } finally {
        await leadership.stop();
        subscription.unsubscribe();
      }
      assert.deepEqual(
        seen
          .filter(({ type }) => type === 'elected' || type === 'deposed')
          .slice(0, 2)
          .map((event) => [event.type, event.key]),
        [
          ['elected', shown(key)],
          ['deposed', shown(key)],
        ],
      );
      assert.doesNotMatch(JSON.stringify(seen), new RegExp(SECRET));
    });

    it("the library's warnings and errors show the key as the module says, never the key itself", async () => {
      const logs = LogCapture.install();
      try {
        // A lock deleted under its holder: using() warns when the work finishes.
        const lost = keyOf();
        await app.locks.using(lost, async () => {
          await redis.del(`lock:{${lost}}`);
        });
        // Leader work that fails is logged, with the key.
        const led = keyOf();
        const leadership = app.locks.lead(led, () => {
          throw new Error('leader work failed');
        });
        assert.ok(
          await eventually(() =>
            logs.capture.lines.some((line) => line.message.includes('Leader work for')),
          ),
          'the failed leader work is logged',
        );
        await leadership.stop();
        const lines = logs.capture.lines.map((line) => line.message);
        assert.ok(
          lines.some((line) => line.includes(`Lock ${shown(lost)} (fence`)),
          lines.join('\n'),
        );
        assert.ok(
          lines.some((line) => line.includes(`Leader work for ${shown(led)}`)),
          lines.join('\n'),
        );
        assert.deepEqual(
          lines.filter((line) => line.includes(SECRET)),
          [],
          'no log line names the key',
        );
      } finally {
        logs.restore();
      }
    });

    it('is checked: an unknown mode fails the boot', async () => {
      for (const [value, shown] of [
        ['redacted', '"redacted"'],
        [null, 'null'],
        ['', '""'],
      ] as const) {
        await assert.rejects(
          startLockModule({ connection: server.url, logKeys: value as unknown as LogKeys }),
          new RegExp(
            `Invalid option "logKeys" \\(${shown}\\): must be 'plain', 'hashed' or 'hidden'`,
          ),
        );
      }
    });
  });
}

describe("logKeys: 'plain' (the default)", () => {
  it('shows keys JSON-quoted in messages and as they are in events', async () => {
    const server = await startRedis();
    const app = await startLockModule({ connection: server.url });
    try {
      const key = `cart:${SECRET}`;
      const seen: LockEvent[] = [];
      const subscription = app.locks.events.subscribe((event) => seen.push(event));
      const held = await app.module.get(LockService).acquire(key);
      const error = await app.locks.acquire(key, { acquireTimeout: 0 }).catch((e: unknown) => e);
      await held.release();
      subscription.unsubscribe();
      assert.ok(error instanceof LockAcquireTimeoutError);
      assert.ok(error.message.includes(JSON.stringify(key)), error.message);
      assert.ok(Object.keys(error).includes('key'));
      assert.ok(seen.length >= 2 && seen.every((event) => event.key === key));
    } finally {
      await app.close();
      await server.stop();
    }
  });
});
