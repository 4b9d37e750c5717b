import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import { Redis } from 'ioredis';
import {
  eventually,
  LogCapture,
  sleep,
  startLockModule,
  uniqueKey,
  type LockModuleFixture,
} from '../support/lock-module.js';
import { startRedis, type RedisServer } from '../support/redis-server.js';

describe('logging', () => {
  let server: RedisServer;
  let app: LockModuleFixture;
  let logs: ReturnType<typeof LogCapture.install>;

  before(async () => {
    server = await startRedis();
    app = await startLockModule({ connection: server.url });
    logs = LogCapture.install(); // after compile(): the testing module installs its own logger
  });
  after(async () => {
    await app?.close();
    await server?.stop();
    logs?.restore();
  });

  it('reports a Redis outage once, and its end once, however many reconnection attempts fail', async () => {
    const key = uniqueKey();
    const lock = await app.locks.acquire(key);
    await server.kill();
    await sleep(1_500); // ioredis retries every 50, 100, 150 ... ms: many failed attempts
    server = await server.restart();
    assert.ok(
      await eventually(
        async () => (await app.locks.tryAcquire(uniqueKey()).catch(() => null)) !== null,
      ),
    );
    const lines = logs.capture.lines.map((line) => `${line.level}: ${line.message}`);
    assert.equal(
      lines.filter((line) => /^warn: Redis connection \(127\.0\.0\.1:\d+\) failed/.test(line))
        .length,
      1,
      lines.join('\n'),
    );
    assert.equal(
      lines.filter((line) => /^log: Redis connection \(127\.0\.0\.1:\d+\) is back/.test(line))
        .length,
      1,
      lines.join('\n'),
    );
    assert.ok(
      lines.every((line) => !line.includes(lock.token)),
      'no token in any log line',
    );
  });

  it('subscriptions Redis refuses are one warning for every key, naming none, until one works', async () => {
    // A user that may not SUBSCRIBE: every waiter's subscription fails.
    const admin = new Redis(server.url);
    const forged = (n: number): string =>
      `${uniqueKey()}:${n}\r\n[Nest] 1  - 11/27/2026  LOG [Auth] admin logged in (forged)`;
    await admin.acl(
      'SETUSER',
      'nosub',
      'on',
      '>pw',
      '~*',
      '&*',
      '+@all',
      '-subscribe',
      '-ssubscribe',
    );
    const restricted = await startLockModule({
      connection: { port: server.port, host: '127.0.0.1', username: 'nosub', password: 'pw' },
    });
    const captured = LogCapture.install(); // after compile(), as above
    try {
      for (const key of [forged(1), forged(2), forged(3)]) {
        const held = await restricted.locks.acquire(key, { ttl: 5_000 });
        await restricted.locks.acquire(key, { acquireTimeout: 100 }).catch(() => undefined);
        await held.release();
      }
      const warnings = captured.capture.lines.filter((line) =>
        line.message.startsWith('Subscribing to lock releases failed'),
      );
      assert.equal(warnings.length, 1, captured.capture.lines.map((l) => l.message).join('\n'));
      assert.doesNotMatch(warnings[0].message, /[\r\n]|forged/);
      assert.match(warnings[0].message, /NOPERM/);
      // The user gets SUBSCRIBE back: the next subscription works, and a line says so.
      await admin.acl('SETUSER', 'nosub', '+subscribe', '+ssubscribe');
      const key = forged(4);
      const held = await restricted.locks.acquire(key, { ttl: 5_000 });
      await restricted.locks.acquire(key, { acquireTimeout: 100 }).catch(() => undefined);
      await held.release();
      assert.ok(
        captured.capture.lines.some((line) =>
          /^Subscribing to lock releases works again after .* \(3 failed attempts\)$/.test(
            line.message,
          ),
        ),
        captured.capture.lines.map((l) => l.message).join('\n'),
      );
    } finally {
      captured.restore();
      await restricted.close();
      await admin.acl('DELUSER', 'nosub');
      admin.disconnect();
    }
  });

  it('channels taken from the user while waiters are subscribed: the refused resubscription is said (found by a review)', async () => {
    const admin = new Redis(server.url);
    await admin.acl('SETUSER', 'revoked', 'on', '>pw', '~*', '&*', '+@all');
    const restricted = await startLockModule({
      connection: { port: server.port, host: '127.0.0.1', username: 'revoked', password: 'pw' },
    });
    const captured = LogCapture.install(); // after compile(), as above
    const key = uniqueKey();
    try {
      const held = await restricted.locks.acquire(key, { ttl: 5_000 });
      const waiter = restricted.locks.acquire(key, { acquireTimeout: 5_000 });
      // Subscribed: the waiter's channel has a subscriber.
      const channel = `lock:{${key}}:released`;
      assert.ok(
        await eventually(async () => {
          const [, count] = (await admin.pubsub('NUMSUB', channel)) as [string, number];
          return count === 1;
        }),
        'the waiter subscribed',
      );
      // Redis drops the subscriber of a channel the user no longer may use; it comes back and
      // subscribes again, refused.
      await admin.acl('SETUSER', 'revoked', 'resetchannels');
      assert.ok(
        await eventually(() =>
          captured.capture.lines.some((line) =>
            /^Subscribing to lock releases failed; .*NOPERM/.test(line.message),
          ),
        ),
        captured.capture.lines.map((line) => line.message).join('\n'),
      );
      await held.release();
      await (await waiter).release(); // found free at its next timed attempt
    } finally {
      captured.restore();
      await restricted.close();
      await admin.acl('DELUSER', 'revoked');
      admin.disconnect();
    }
  });
});
