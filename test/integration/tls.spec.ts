/**
 * TLS and authentication failures say what went wrong (issue 43, item 7): the certificate or the
 * credentials, in the error a call fails with and in the health report, not "Reached the max
 * retries per request limit". The server's certificate is a self-signed test fixture
 * (test/fixtures/tls, for 127.0.0.1, valid for a hundred years).
 */
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { after, before, describe, it } from 'node:test';
import { Redis } from 'ioredis';
import { LockBackendError, LockService } from '../../lib/index.js';
import { LogCapture } from '../support/lock-module.js';
import { freePort, startRedis, type RedisServer } from '../support/redis-server.js';

/** The fixtures, from build/test/integration. */
const fixture = (name: string): string =>
  fileURLToPath(new URL(`../../../test/fixtures/tls/${name}`, import.meta.url));

describe('TLS and authentication failures', () => {
  let server: RedisServer;
  let tlsPort: number;
  let logs: ReturnType<typeof LogCapture.install>;

  before(async () => {
    tlsPort = await freePort();
    server = await startRedis([
      '--tls-port',
      String(tlsPort),
      '--tls-cert-file',
      fixture('cert.pem'),
      '--tls-key-file',
      fixture('key.pem'),
      '--tls-auth-clients',
      'no',
    ]);
    const admin = new Redis(server.url);
    await admin.acl('SETUSER', 'app', 'on', '>right', '~*', '&*', '+@all');
    admin.disconnect();
    logs = LogCapture.install(); // the connection warnings are expected here
  });
  after(async () => {
    logs?.restore();
    await server?.stop();
  });

  /** What a call and the health check say with `connection`. */
  async function failures(connection: ConstructorParameters<typeof LockService>[0]['connection']) {
    const locks = new LockService({ connection, commandTimeout: 500 });
    try {
      const error = await locks.tryAcquire('k').then(
        () => assert.fail('acquired'),
        (e: unknown) => e,
      );
      assert.ok(error instanceof LockBackendError, String(error));
      const health = await locks.checkHealth();
      return { message: error.message, health: JSON.stringify(health) };
    } finally {
      await locks.onApplicationShutdown();
    }
  }

  it('an untrusted certificate is named in the error and the health report', async () => {
    const { message, health } = await failures(`rediss://127.0.0.1:${tlsPort}`);
    assert.match(message, /is unreachable \(self-signed certificate\)/);
    assert.doesNotMatch(message, /max retries/i);
    assert.match(health, /"up":false/);
    assert.match(health, /self-signed certificate/);
  });

  it('a trusted certificate works', async () => {
    const locks = new LockService({
      connection: {
        host: '127.0.0.1',
        port: tlsPort,
        tls: { ca: readFileSync(fixture('cert.pem')) },
      },
    });
    try {
      const lock = await locks.acquire('k');
      assert.equal(await lock.release(), true);
    } finally {
      await locks.onApplicationShutdown();
    }
  });

  it('wrong credentials are named in the error and the health report, never the password', async () => {
    const { message, health } = await failures({
      host: '127.0.0.1',
      port: server.port,
      username: 'app',
      password: 'wrong-secret',
    });
    assert.match(message, /WRONGPASS/);
    assert.doesNotMatch(message, /max retries/i);
    assert.match(health, /WRONGPASS/);
    assert.ok(!`${message}${health}`.includes('wrong-secret'));
  });
});
