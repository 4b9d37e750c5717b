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

  it('a key from code in a warning is quoted: a CR/LF in it cannot forge a log line', async () => {
    // A user that may not SUBSCRIBE: the waiter's subscription fails and says so, naming the key.
    const admin = new Redis(server.url);
    const forged = `${uniqueKey()}\r\n[Nest] 1  - 11/27/2026  LOG [Auth] admin logged in (forged)`;
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
      const held = await restricted.locks.acquire(forged, { ttl: 5_000 });
      await restricted.locks.acquire(forged, { acquireTimeout: 300 }).catch(() => undefined);
      await held.release();
      const warning = captured.capture.lines.find((line) =>
        line.message.startsWith('Could not subscribe to lock releases'),
      );
      assert.ok(warning, captured.capture.lines.map((line) => line.message).join('\n'));
      assert.doesNotMatch(warning.message, /[\r\n]/);
      assert.ok(warning.message.includes(JSON.stringify(forged).slice(1, -1)), warning.message);
    } finally {
      captured.restore();
      await restricted.close();
      await admin.acl('DELUSER', 'nosub');
      admin.disconnect();
    }
  });
});
