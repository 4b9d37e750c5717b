import assert from 'node:assert/strict';
import { inspect } from 'node:util';
import { after, before, describe, it } from 'node:test';
import { Injectable, Logger, Module } from '@nestjs/common';
import { Test } from '@nestjs/testing';
import { Redis, type RedisOptions } from 'ioredis';
import {
  LockLostError,
  LockArgumentError,
  LockService,
  RedisLockConfigurationError,
  RedisLockModule,
  RedisLockShutdownError,
  WithLock,
  type RedisLockModuleOptions,
} from '../../lib/index.js';
import { createLockBackend } from '../../lib/redis/lock-backend.factory.js';
import { resolveModuleOptions } from '../../lib/options/module-options.js';
import { eventually, sleep, startLockModule, uniqueKey } from '../support/lock-module.js';
import { FaultProxy, posingAsRedis6 } from '../support/fault-proxy.js';
import { listeners } from '../support/listeners.js';
import { startRedis, type RedisServer } from '../support/redis-server.js';

/** A module that does not import RedisLockModule: it sees LockService only if that is global. */
@Injectable()
class Consumer {
  constructor(readonly locks: LockService) {}
}
@Module({ providers: [Consumer] })
class FeatureModule {}

/** A provider with a locked method, in a module that does not import RedisLockModule. */
@Injectable()
class LockedConsumer {
  @WithLock('order:{0}')
  async pay(id: string): Promise<string> {
    return id;
  }
}
@Module({ providers: [LockedConsumer] })
class LockedFeatureModule {}

/** A job that keeps its key 30 s, with no ttl of its own: it locks with the module's default. */
@Injectable()
class LongHoldJob {
  @WithLock({ key: 'job:report', onBusy: 'skip', holdAtLeast: 30_000 })
  async run(): Promise<void> {}
}

/** Keys up to 1,000 characters: more than the module's default maxKeyLength allows. */
@Injectable()
class LongKeys {
  @WithLock({ key: 'doc:{0}', maxKeyLength: 1_000 })
  async save(id: string): Promise<string> {
    return id;
  }
}

describe('RedisLockModule', () => {
  let server: RedisServer;
  let redis: Redis;

  before(async () => {
    server = await startRedis();
    redis = new Redis(server.port, '127.0.0.1');
  });
  after(async () => {
    redis?.disconnect();
    await server?.stop();
  });

  /** Takes a lock through `locks` and checks it landed in this test's Redis under `prefix`. */
  async function assertWorks(locks: LockService, prefix = 'lock:'): Promise<void> {
    const key = uniqueKey();
    const lock = await locks.acquire(key);
    assert.equal(await redis.get(`${prefix}{${key}}`), lock.token);
    await lock.release();
  }

  describe('forRoot', () => {
    it('connects from a URL', async () => {
      const app = await startLockModule({ connection: server.url });
      await assertWorks(app.locks);
      await app.close();
    });

    it('connects from ioredis options and applies keyPrefix and defaults', async () => {
      const app = await startLockModule({
        connection: { host: '127.0.0.1', port: server.port },
        keyPrefix: 'myapp:locks:',
        defaults: { ttl: 12_345 },
      });
      await assertWorks(app.locks, 'myapp:locks:');
      const key = uniqueKey();
      await app.locks.acquire(key);
      const pttl = await redis.pttl(`myapp:locks:{${key}}`);
      assert.ok(pttl > 10_000 && pttl <= 12_345, `pttl ${pttl}`);
      await app.close();
    });

    it('sets its documented ioredis options on connections it creates, lets yours win (but lazyConnect), and never touches a given client', async () => {
      const optionsOf = (options: RedisLockModuleOptions): RedisOptions => {
        const backend = createLockBackend(resolveModuleOptions(options), new Logger('test'));
        void backend.close();
        return (backend as unknown as { client: Redis }).client.options;
      };
      const own = optionsOf({ connection: server.url });
      assert.equal(own.maxRetriesPerRequest, 0);
      assert.equal(own.autoResendUnfulfilledCommands, false);
      assert.equal(own.lazyConnect, true);
      assert.equal(own.enableOfflineQueue, true);
      // A READONLY reply (a demoted master) reconnects; other errors do not.
      assert.equal(own.reconnectOnError?.(new Error("READONLY You can't write")), true);
      assert.equal(own.reconnectOnError?.(new Error('ERR something else')), false);
      assert.notEqual(own.failoverDetector, true, 'Sentinel-only settings stay off');
      const sentinel = optionsOf({
        connection: { sentinels: [{ host: '127.0.0.1', port: server.port }], name: 'mymaster' },
      });
      assert.equal(sentinel.failoverDetector, true);
      assert.deepEqual(
        [1, 2, 5, 100].map((times) => sentinel.retryStrategy?.(times)),
        [50, 100, 250, 250],
      );
      assert.equal(
        optionsOf({
          connection: { sentinels: [{ port: server.port }], name: 'm', failoverDetector: false },
        }).failoverDetector,
        false,
        'yours win',
      );
      const yours = optionsOf({
        connection: { port: server.port, maxRetriesPerRequest: 3, lazyConnect: false },
      });
      assert.equal(yours.maxRetriesPerRequest, 3);
      assert.equal(yours.lazyConnect, true);
      const client = new Redis(server.port, '127.0.0.1', { lazyConnect: true });
      assert.equal(optionsOf({ client }).maxRetriesPerRequest, 20);
      assert.equal(client.options.autoResendUnfulfilledCommands, true);
      client.disconnect();
    });

    it('uses the client it is given and never closes it, nor leaves a listener of its own on it', async () => {
      const client = new Redis(server.port, '127.0.0.1');
      await client.ping();
      const before = listeners(client);
      const app = await startLockModule({ client });
      await assertWorks(app.locks);
      await app.close();
      assert.equal(listeners(client), before, 'listeners left on the app’s client');
      assert.equal(client.status, 'ready');
      assert.equal(await client.ping(), 'PONG');
      client.disconnect();
    });

    it('closes the client it created, and its pub/sub connection, on shutdown', async () => {
      const connectionName = uniqueKey('owned');
      const app = await startLockModule({
        connection: { host: '127.0.0.1', port: server.port, connectionName },
      });
      try {
        await assertWorks(app.locks);
        // Wait on a held lock so that the pub/sub connection exists too.
        const held = await app.locks.acquire('busy');
        await assert.rejects(app.locks.acquire('busy', { acquireTimeout: 100 }));
        await held.release();
        assert.equal(await clientCount(connectionName), 2);
      } finally {
        await app.close();
      }
      assert.ok(await eventually(async () => (await clientCount(connectionName)) === 0, 2_000));
    });

    it('isGlobal makes LockService injectable in modules that do not import it', async () => {
      const module = await Test.createTestingModule({
        imports: [
          RedisLockModule.forRoot({ connection: server.url, isGlobal: true }),
          FeatureModule,
        ],
      }).compile();
      await assertWorks(module.get(Consumer).locks);
      await module.close();
    });

    it('two global registrations in one app fail the boot; one global and one imported is fine', async () => {
      await assert.rejects(
        Test.createTestingModule({
          imports: [
            RedisLockModule.forRoot({ connection: server.url, isGlobal: true, keyPrefix: 'a:' }),
            RedisLockModule.forRoot({ connection: server.url, isGlobal: true, keyPrefix: 'b:' }),
            FeatureModule,
          ],
        })
          .compile()
          .then((module) => module.init()),
        (error: Error) =>
          error instanceof RedisLockConfigurationError &&
          error.option === 'isGlobal' &&
          /registers RedisLockModule with isGlobal 2 times/.test(error.message),
      );
      @Module({
        imports: [RedisLockModule.forRoot({ connection: server.url, keyPrefix: 'b:' })],
        providers: [Consumer],
      })
      class OwnLocksModule {}
      const module = await Test.createTestingModule({
        imports: [
          RedisLockModule.forRoot({ connection: server.url, isGlobal: true, keyPrefix: 'a:' }),
          OwnLocksModule,
          FeatureModule,
        ],
      }).compile();
      await module.init();
      await assertWorks(module.select(FeatureModule).get(Consumer, { strict: true }).locks, 'a:');
      await assertWorks(module.select(OwnLocksModule).get(Consumer, { strict: true }).locks, 'b:');
      await module.close();
    });

    it("a holdAtLeast above the module's defaults.ttl, on a method with no ttl of its own, fails the boot (not every call)", async () => {
      await assert.rejects(
        Test.createTestingModule({
          imports: [RedisLockModule.forRoot({ connection: server.url })],
          providers: [LongHoldJob],
        })
          .compile()
          .then((module) => module.init()),
        (error: Error) =>
          error instanceof RedisLockConfigurationError &&
          error.option === '@WithLock(LongHoldJob.run).holdAtLeast' &&
          /defaults\.ttl \(10000 ms\).*ttl of at least 30000 ms/.test(error.message),
      );
      const module = await Test.createTestingModule({
        imports: [RedisLockModule.forRoot({ connection: server.url, defaults: { ttl: 60_000 } })],
        providers: [LongHoldJob],
      }).compile();
      await module.init();
      await module.get(LongHoldJob).run();
      await module.close();
    });

    it("a @WithLock maxKeyLength above the module's fails the boot; maxKeyLength is checked like every option", async () => {
      await assert.rejects(
        Test.createTestingModule({
          imports: [RedisLockModule.forRoot({ connection: server.url })],
          providers: [LongKeys],
        })
          .compile()
          .then((module) => module.init()),
        (error: Error) =>
          error instanceof RedisLockConfigurationError &&
          error.option === '@WithLock(LongKeys.save).maxKeyLength' &&
          /must not exceed the module's maxKeyLength \(512\)/.test(error.message),
      );
      for (const bad of [0, 1.5, '100', -1]) {
        assert.throws(
          () => resolveModuleOptions({ connection: server.url, maxKeyLength: bad as number }),
          (error: Error) =>
            error instanceof RedisLockConfigurationError && error.option === 'maxKeyLength',
        );
      }
      const module = await Test.createTestingModule({
        imports: [RedisLockModule.forRoot({ connection: server.url, maxKeyLength: 1_000 })],
        providers: [LongKeys],
      }).compile();
      await module.init();
      const id = 'x'.repeat(990);
      assert.equal(await module.get(LongKeys).save(id), id);
      const locks = module.get(LockService);
      await assert.rejects(
        locks.using('y'.repeat(1_001), () => 'never'),
        (error: Error) =>
          error instanceof LockArgumentError &&
          /is 1001 characters long, more than maxKeyLength \(1000\)/.test(error.message),
      );
      await module.close();
    });

    it('a @WithLock provider in a module that cannot see LockService fails the boot saying what to do', async () => {
      await assert.rejects(
        Test.createTestingModule({
          imports: [RedisLockModule.forRoot({ connection: server.url }), LockedFeatureModule],
        }).compile(),
        (error: Error) =>
          /LockedConsumer/.test(error.message) &&
          /import RedisLockModule into this module, or register it with isGlobal: true/.test(
            error.message,
          ) &&
          !/nestjs-redis-lock:/.test(error.message),
      );
    });
  });

  describe('forRootAsync', () => {
    @Injectable()
    class RedisConfig {
      readonly url = `redis://127.0.0.1:${server.port}`;
    }
    @Module({ providers: [RedisConfig], exports: [RedisConfig] })
    class ConfigModule {}

    @Injectable()
    class LockOptionsFactory {
      constructor(private readonly config: RedisConfig) {}
      create(): RedisLockModuleOptions {
        return { connection: this.config.url, keyPrefix: 'factory:' };
      }
    }

    it('useFactory with imports and inject', async () => {
      const module = await Test.createTestingModule({
        imports: [
          RedisLockModule.forRootAsync({
            imports: [ConfigModule],
            inject: [RedisConfig],
            useFactory: async (config: RedisConfig) => ({
              connection: config.url,
              keyPrefix: 'async:',
            }),
          }),
        ],
      }).compile();
      await assertWorks(module.get(LockService), 'async:');
      await module.close();
    });

    it('useClass', async () => {
      const module = await Test.createTestingModule({
        imports: [
          RedisLockModule.forRootAsync({
            imports: [ConfigModule],
            useClass: class {
              constructor() {}
              create(): RedisLockModuleOptions {
                return { connection: `redis://127.0.0.1:${server.port}`, keyPrefix: 'class:' };
              }
            },
          }),
        ],
      }).compile();
      await assertWorks(module.get(LockService), 'class:');
      await module.close();
    });

    it('useExisting', async () => {
      @Module({
        imports: [ConfigModule],
        providers: [LockOptionsFactory],
        exports: [LockOptionsFactory],
      })
      class OptionsModule {}
      const module = await Test.createTestingModule({
        imports: [
          RedisLockModule.forRootAsync({
            imports: [OptionsModule],
            useExisting: LockOptionsFactory,
          }),
        ],
      }).compile();
      await assertWorks(module.get(LockService), 'factory:');
      await module.close();
    });

    it('isGlobal', async () => {
      const module = await Test.createTestingModule({
        imports: [
          RedisLockModule.forRootAsync({
            isGlobal: true,
            useFactory: () => ({ connection: server.url }),
          }),
          FeatureModule,
        ],
      }).compile();
      await assertWorks(module.get(Consumer).locks);
      await module.close();
    });
  });

  describe('bad configuration fails at bootstrap', () => {
    const cases: [string, () => RedisLockModuleOptions, string][] = [
      ['none of client, connection, nodes', () => ({}), 'client | connection | nodes'],
      [
        'both client and connection',
        () => ({ client: redis, connection: server.url }),
        'client + connection',
      ],
      ['a client that is not ioredis', () => ({ client: {} as never }), 'client'],
      ['a URL that is not redis://', () => ({ connection: 'http://localhost' }), 'connection'],
      ['braces in keyPrefix', () => ({ connection: server.url, keyPrefix: '{app}:' }), 'keyPrefix'],
      [
        'a NaN default ttl',
        () => ({ connection: server.url, defaults: { ttl: Number.NaN } }),
        'defaults.ttl',
      ],
      [
        'a zero default ttl',
        () => ({ connection: server.url, defaults: { ttl: 0 } }),
        'defaults.ttl',
      ],
      [
        'a negative acquireTimeout',
        () => ({ connection: server.url, defaults: { acquireTimeout: -5 } }),
        'defaults.acquireTimeout',
      ],
      [
        'a string retryInterval',
        () => ({ connection: server.url, defaults: { retryInterval: '100' as never } }),
        'defaults.retryInterval',
      ],
      [
        'a non-boolean autoExtend',
        () => ({ connection: server.url, defaults: { autoExtend: 'yes' as never } }),
        'defaults.autoExtend',
      ],
      [
        'a zero commandTimeout',
        () => ({ connection: server.url, commandTimeout: 0 }),
        'commandTimeout',
      ],
      [
        'an Infinity commandTimeout',
        () => ({ connection: server.url, commandTimeout: Infinity }),
        'commandTimeout',
      ],
      [
        'a string commandTimeout',
        () => ({ connection: server.url, commandTimeout: '500' as never }),
        'commandTimeout',
      ],
      [
        'a negative fenceRetention',
        () => ({ connection: server.url, fenceRetention: -1 }),
        'fenceRetention',
      ],
      [
        'a fractional fenceRetention',
        () => ({ connection: server.url, fenceRetention: 1.5 }),
        'fenceRetention',
      ],
      [
        'a negative handoffTurn',
        () => ({ connection: server.url, handoffTurn: -25 }),
        'handoffTurn',
      ],
      [
        'handoffTurn with replicaAck (no handoffs to bound)',
        () => ({
          connection: server.url,
          handoffTurn: 100,
          replicaAck: { replicas: 1, timeout: 100 },
        }),
        'handoffTurn + replicaAck',
      ],
      [
        'handoffTurn with Redlock nodes (no handoffs to bound)',
        () => ({
          nodes: [server.url, server.url.replace(/:\d+$/, ':1'), server.url.replace(/:\d+$/, ':2')],
          handoffTurn: 100,
        }),
        'handoffTurn + nodes',
      ],
      [
        "fenceRetention 0 with Redlock nodes (fences would follow the nodes' clocks, backwards)",
        () => ({
          nodes: [server.url, server.url.replace(/:\d+$/, ':1'), server.url.replace(/:\d+$/, ':2')],
          fenceRetention: 0,
        }),
        'fenceRetention + nodes',
      ],
      [
        'a URL with a password that is not redis:// (and stays out of the message)',
        () => ({ connection: 'http://user:s3cret@localhost' }),
        'connection',
      ],
      [
        'a mistyped URL with a password (redis:/)',
        () => ({ connection: 'redis:/:s3cret@localhost:6379' }),
        'connection',
      ],
      [
        'a password and host without a scheme',
        () => ({ connection: 's3cret@localhost:6379' }),
        'connection',
      ],
      [
        'a libpq-style string with a password',
        () => ({ connection: 'host=localhost password=s3cret' }),
        'connection',
      ],
      [
        'a long password with / and @ in it',
        () => ({ connection: `http://user:${'s3cret/@'.repeat(12)}x@localhost` }),
        'connection',
      ],
      [
        'nodes given as one string with a password',
        () => ({ nodes: 'redis://:s3cret@127.0.0.1:1' as never }),
        'nodes',
      ],
      ['ttl at the top level', () => ({ connection: server.url, ttl: 1_000 }) as never, 'ttl'],
      [
        'an unknown default',
        () => ({ connection: server.url, defaults: { tll: 1_000 } as never }),
        'defaults.tll',
      ],
    ];
    for (const [name, options, option] of cases) {
      it(`${name} → RedisLockConfigurationError naming ${option}`, async () => {
        const error = await Test.createTestingModule({
          imports: [RedisLockModule.forRootAsync({ useFactory: options })],
        })
          .compile()
          .catch((e: unknown) => e);
        assert.ok(error instanceof RedisLockConfigurationError, String(error));
        assert.equal(error.option, option);
        assert.ok(!error.message.includes('s3cret'), 'no password in the message');
        // Printed whole when a bootstrap fails: its fields too.
        assert.ok(!inspect(error).includes('s3cret'), 'no password in the error');
      });
    }

    it('a server older than Redis 7 is refused at startup, naming its version (its INFO rewritten by a proxy)', async () => {
      const proxy = await FaultProxy.start(() => server.port);
      const client = new Redis(server.port);
      try {
        await posingAsRedis6(proxy, client);
        const module = await Test.createTestingModule({
          imports: [RedisLockModule.forRoot({ connection: `redis://127.0.0.1:${proxy.port}` })],
        }).compile();
        const error = await module.init().then(
          () => undefined,
          (e: unknown) => e,
        );
        await module.close().catch((closing: unknown) => assert.equal(closing, error));
        assert.ok(error instanceof RedisLockConfigurationError, String(error));
        assert.equal(error.option, 'Redis server');
        assert.match(error.message, /Redis 6\.\d+\.\d+.*needs Redis 7\.0 or newer/);
      } finally {
        client.disconnect();
        await proxy.close();
      }
    });

    it('forRootAsync without useFactory, useClass or useExisting is refused at once, saying what to give', () => {
      assert.throws(
        () => RedisLockModule.forRootAsync({}),
        (error: unknown) =>
          error instanceof RedisLockConfigurationError &&
          error.option === 'forRootAsync' &&
          /useFactory .*useClass or useExisting/.test(error.problem),
      );
    });

    it('forRoot fails the same way', async () => {
      await assert.rejects(
        Test.createTestingModule({ imports: [RedisLockModule.forRoot({})] }).compile(),
        RedisLockConfigurationError,
      );
    });
  });

  describe('shutdown', () => {
    it('rejects pending acquisitions, releases held locks and aborts their signals, refuses new calls', async () => {
      const app = await startLockModule({ connection: server.url });
      const key = uniqueKey();
      const heldKey = uniqueKey('held');
      let workSignal: AbortSignal | undefined;
      let finishWork!: () => void;
      const work = app.locks.using(heldKey, (lock) => {
        workSignal = lock.signal;
        return new Promise<void>((resolve) => (finishWork = resolve));
      });
      const blocker = await app.locks.acquire(key, { ttl: 30_000 });
      const pending = app.locks.acquire(key, { acquireTimeout: 20_000 }).catch((e: unknown) => e);
      await sleep(100);

      const closing = app.close();
      const rejected = await pending;
      assert.ok(rejected instanceof RedisLockShutdownError);
      assert.equal(rejected.key, key);
      await closing;

      assert.equal(await redis.exists(`lock:{${key}}`), 0, 'held lock released');
      assert.equal(await redis.exists(`lock:{${heldKey}}`), 0, 'lock of running work released');
      assert.ok(workSignal?.aborted);
      assert.equal((workSignal.reason as LockLostError).reason, 'shutdown');
      assert.equal(await blocker.release(), false);
      finishWork();
      await work;
      await assert.rejects(app.locks.acquire(uniqueKey()), RedisLockShutdownError);
    });
  });

  async function clientCount(name: string): Promise<number> {
    const list = String(await redis.client('LIST'));
    return list.split('\n').filter((line) => line.includes(` name=${name} `)).length;
  }
});
