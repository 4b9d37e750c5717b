import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import { Readable } from 'node:stream';
import {
  Controller,
  Get,
  Inject,
  Injectable,
  Module,
  Param,
  Scope,
  type CallHandler,
  type ExecutionContext,
  type NestInterceptor,
  type OnApplicationBootstrap,
  type PipeTransform,
} from '@nestjs/common';
import { ContextIdFactory, LazyModuleLoader } from '@nestjs/core';
import { Interval, ScheduleModule } from '@nestjs/schedule';
import { Test, type TestingModule } from '@nestjs/testing';
import { ClientProxyFactory, MessagePattern, Transport } from '@nestjs/microservices';
import { Observable, catchError, interval, map, take, throwError, timeout } from 'rxjs';
import { RequestTimeoutException } from '@nestjs/common';
import {
  getCurrentLock,
  LockService,
  RedisLockConfigurationError,
  RedisLockModule,
  WhileLeader,
  WithLock,
  type LeaderTerm,
} from '../../lib/index.js';
import { eventually, LogCapture, sleep, uniqueKey } from '../support/lock-module.js';
import { freePort, startRedis, type RedisServer } from '../support/redis-server.js';
import { assertWithin, watchStalls } from '../support/timing.js';

/**
 * `close()` of an app whose startup failed: NestJS 12 shuts it down (resolves `true`); NestJS 11
 * rethrows the startup's error and calls no hook, so the lock module is shut down by hand here
 * (resolves `false`), as a process would exit.
 */
async function closeFailed(module: TestingModule): Promise<boolean> {
  try {
    await module.close();
    return true;
  } catch {
    const locks = module.get(LockService);
    await locks.onModuleDestroy();
    await locks.onApplicationShutdown();
    return false;
  }
}

/**
 * The Nest layer under the provider kinds, lifecycle orders and decorator combinations real apps
 * use (issue 42). Each case failed on the code before its fix.
 */
describe('the Nest layer: provider kinds, lifecycles and combinations', () => {
  let server: RedisServer;
  before(async () => {
    server = await startRedis();
  });
  after(async () => {
    await server?.stop();
  });
  const lockModule = (isGlobal = true, keyPrefix = `${uniqueKey('nest')}:`) =>
    RedisLockModule.forRoot({ connection: server.url, isGlobal, keyPrefix });

  it("stops lead() and @WhileLeader leaders before any provider's onModuleDestroy, and campaigns only once every onApplicationBootstrap has returned", async () => {
    for (const layout of ['global', 'imported', 'feature'] as const) {
      const keys = { lead: uniqueKey('lead'), whileLeader: uniqueKey('while') };
      @Injectable()
      class Db implements OnApplicationBootstrap {
        open = true;
        ready = false;
        readonly late: string[] = [];
        readonly notReady: string[] = [];
        write(who: string): void {
          if (!this.open) this.late.push(who);
          if (!this.ready) this.notReady.push(who);
        }
        async onApplicationBootstrap(): Promise<void> {
          await sleep(50); // connecting takes a moment
          this.ready = true;
        }
        async onModuleDestroy(): Promise<void> {
          this.open = false;
          await sleep(30);
        }
      }
      @Injectable()
      class Campaigner implements OnApplicationBootstrap {
        constructor(
          readonly locks: LockService,
          readonly db: Db,
        ) {}
        onApplicationBootstrap(): void {
          this.locks.lead(keys.lead, async ({ signal }) => {
            while (!signal.aborted) {
              this.db.write('lead()');
              await sleep(2);
            }
          });
        }
        @WhileLeader(keys.whileLeader, { ttl: 5_000 })
        async work({ signal }: LeaderTerm): Promise<void> {
          while (!signal.aborted) {
            this.db.write('@WhileLeader');
            await sleep(2);
          }
        }
      }
      @Module({ providers: [Db, Campaigner] })
      class Feature {}
      const imports = [lockModule(layout !== 'imported')];
      const module = await Test.createTestingModule(
        layout === 'feature'
          ? { imports: [...imports, Feature] }
          : { imports, providers: [Db, Campaigner] },
      ).compile();
      await module.init();
      const db = module.get(Db);
      const locks = module.get(LockService);
      assert.ok(
        await eventually(async () => (await locks.isLocked(keys.lead)) && db.late.length === 0),
        `${layout}: lead() never led`,
      );
      assert.ok(await eventually(() => locks.isLocked(keys.whileLeader)), `${layout}: no leader`);
      await module.close();
      assert.deepEqual(db.late, [], `${layout}: a leader wrote after its database was closed`);
      assert.deepEqual(
        db.notReady.filter((who) => who === '@WhileLeader'),
        [],
        `${layout}: @WhileLeader worked before the app's bootstrap was over`,
      );
    }
  });

  it('an app whose bootstrap fails never campaigns', async () => {
    const key = uniqueKey('failed-boot');
    @Injectable()
    class Leader {
      @WhileLeader(key)
      async work({ signal }: LeaderTerm): Promise<void> {
        await new Promise((resolve) => signal.addEventListener('abort', resolve));
      }
    }
    @Injectable()
    class Broken {
      onApplicationBootstrap(): void {
        throw new Error('cannot start');
      }
    }
    const module = await Test.createTestingModule({
      imports: [lockModule()],
      providers: [Leader, Broken],
    }).compile();
    try {
      await assert.rejects(module.init(), /cannot start/);
      await sleep(300);
      assert.equal(await module.get(LockService).isLocked(key), false);
    } finally {
      await closeFailed(module);
    }
  });

  it('@WhileLeader on a transient provider is warned about and leads nothing (never with a half-made instance)', async () => {
    const key = uniqueKey('transient');
    let terms = 0;
    @Injectable()
    class Repo {
      ok = true;
    }
    @Injectable({ scope: Scope.TRANSIENT })
    class Transient {
      constructor(readonly repo: Repo) {}
      @WhileLeader(key)
      async work(): Promise<void> {
        terms++;
        assert.ok(this.repo.ok);
      }
    }
    @Injectable()
    class User {
      constructor(readonly transient: Transient) {}
    }
    const module = await Test.createTestingModule({
      imports: [lockModule()],
      providers: [Repo, Transient, User],
    }).compile();
    const { capture, restore } = LogCapture.install();
    try {
      await module.init();
      await sleep(200);
      const warned = capture.lines.filter(
        ({ level, message }) => level === 'warn' && message.includes('Transient'),
      );
      assert.equal(warned.length, 1, JSON.stringify(capture.lines));
      assert.equal(terms, 0);
      assert.equal(await module.get(LockService).isLocked(key), false);
    } finally {
      restore();
      await module.close();
    }
  });

  it('refuses generators when decorated and async iterables when returned: the iteration would run unlocked', async () => {
    assert.throws(() => {
      class Gen {
        @WithLock('gen')
        async *rows(): AsyncGenerator<number> {
          yield 1;
        }
      }
      return Gen;
    }, RedisLockConfigurationError);
    assert.throws(() => {
      class SyncGen {
        @WithLock('gen')
        *rows(): Generator<number> {
          yield 1;
        }
      }
      return SyncGen;
    }, RedisLockConfigurationError);
    const key = uniqueKey('iterable');
    @Injectable()
    class Export {
      @WithLock(key)
      async stream(): Promise<Readable> {
        return Readable.from(['a', 'b']);
      }
      @WithLock(key)
      async iterable(): Promise<AsyncIterable<number>> {
        return (async function* () {
          yield 1;
        })();
      }
    }
    const module = await Test.createTestingModule({
      imports: [lockModule()],
      providers: [Export],
    }).compile();
    await module.init();
    try {
      const exporter = module.get(Export);
      await assert.rejects(exporter.stream(), /cannot be held across the iterations/);
      await assert.rejects(exporter.iterable(), RedisLockConfigurationError);
      assert.equal(await module.get(LockService).isLocked(key), false, 'released');
    } finally {
      await module.close();
    }
  });

  it('gives request-scoped and transient useFactory providers, and those of lazily loaded modules, their LockService', async () => {
    const key = uniqueKey('factory');
    class Repo {
      @WithLock(`${key}:{0}`)
      async save(_id: string): Promise<string | undefined> {
        return getCurrentLock()?.key;
      }
    }
    @Injectable()
    class Consumer {
      constructor(@Inject('transient') readonly repo: Repo) {}
    }
    const leaderKey = uniqueKey('lazy-leader');
    @Injectable()
    class LazyLeader {
      @WhileLeader(leaderKey)
      async work({ signal }: LeaderTerm): Promise<void> {
        await new Promise((resolve) => signal.addEventListener('abort', resolve));
      }
    }
    @Module({
      providers: [{ provide: 'lazy', useFactory: () => new Repo() }, LazyLeader],
      exports: ['lazy'],
    })
    class LazyModule {}
    const module = await Test.createTestingModule({
      imports: [lockModule()],
      providers: [
        { provide: 'request', useFactory: () => new Repo(), scope: Scope.REQUEST },
        { provide: 'transient', useFactory: () => new Repo(), scope: Scope.TRANSIENT },
        Consumer,
      ],
    }).compile();
    await module.init();
    try {
      const perRequest = await module.resolve<Repo>('request', ContextIdFactory.create());
      assert.equal(await perRequest.save('1'), `${key}:1`);
      assert.equal(await module.get(Consumer).repo.save('2'), `${key}:2`);
      const perCall = await module.resolve<Repo>('transient');
      assert.equal(await perCall.save('3'), `${key}:3`);
      const lazy = await module.get(LazyModuleLoader).load(() => LazyModule);
      assert.equal(await lazy.get<Repo>('lazy').save('4'), `${key}:4`);
      assert.ok(
        await eventually(() => module.get(LockService).isLocked(leaderKey)),
        'a @WhileLeader provider of a lazily loaded module campaigns',
      );
    } finally {
      await module.close();
    }
  });

  it('a useValue instance used by two apps: the next app takes it over once the first closed, and is refused while the first runs', async () => {
    const key = uniqueKey('shared');
    class Shared {
      @WithLock(key)
      async run(): Promise<string | undefined> {
        await sleep(200);
        return getCurrentLock()?.key;
      }
    }
    const shared = new Shared();
    const boot = async (prefix: string) => {
      const module = await Test.createTestingModule({
        imports: [lockModule(true, prefix)],
        providers: [{ provide: Shared, useValue: shared }],
      }).compile();
      await module.init();
      return module;
    };
    const first = await boot(`${uniqueKey('first')}:`);
    assert.equal(await shared.run(), key);
    const second = await Test.createTestingModule({
      imports: [lockModule(true, `${uniqueKey('second')}:`)],
      providers: [{ provide: Shared, useValue: shared }],
    }).compile();
    await assert.rejects(second.init(), /already used by another Nest app that is still running/);
    await closeFailed(second);
    await first.close();
    const third = await boot(`${uniqueKey('third')}:`);
    try {
      const running = shared.run();
      assert.ok(
        await eventually(() => third.get(LockService).isLocked(key), 150),
        "the lock is taken on the running app's Redis, under its prefix",
      );
      assert.equal(await running, key);
    } finally {
      await third.close();
    }
  });

  describe('over HTTP', () => {
    let app: Awaited<ReturnType<typeof httpApp>> | undefined;
    const seen: unknown[][] = [];
    const keyArgs: number[] = [];
    let walks = 0;

    @Controller('base')
    class Base {
      @Get(':id')
      @WithLock({ key: 'base:{0}' })
      async get(@Param('id') id: string): Promise<unknown> {
        return { id, key: getCurrentLock()?.key };
      }
      @Get('')
      @WithLock('base:none')
      async none(): Promise<unknown> {
        return { key: getCurrentLock()?.key };
      }
    }
    @Controller('plain')
    class PlainOverride extends Base {
      @Get(':id')
      override async get(@Param('id') id: string, ...rest: unknown[]): Promise<unknown> {
        seen.push(rest);
        return { id, key: getCurrentLock()?.key ?? null };
      }
    }
    @Controller('own')
    class OwnOverride extends Base {
      @Get(':id')
      @WithLock({
        key: (...args: unknown[]) => {
          keyArgs.push(args.length);
          return `own:${String(args[0])}`;
        },
      })
      override async get(@Param('id') id: string): Promise<unknown> {
        return { id, key: getCurrentLock()?.key };
      }
    }
    /** A global "sanitise everything" pipe that walks every argument, with no guard for cycles. */
    class DeepWalkPipe implements PipeTransform {
      transform(value: unknown): unknown {
        const walk = (node: unknown): void => {
          walks++;
          if (typeof node !== 'object' || node === null) return;
          for (const child of Object.values(node)) walk(child);
        };
        walk(value);
        return value;
      }
    }
    async function httpApp() {
      const module = await Test.createTestingModule({
        imports: [lockModule()],
        controllers: [Base, PlainOverride, OwnOverride],
      }).compile();
      const nest = module.createNestApplication({ logger: false });
      nest.useGlobalPipes(new DeepWalkPipe());
      await nest.listen(0, '127.0.0.1');
      return { nest, url: await nest.getUrl() };
    }
    before(async () => {
      app = await httpApp();
    });
    after(async () => {
      await app?.nest.close();
    });

    it('keeps the hidden context out of subclass overrides, key functions and global pipes', async () => {
      const get = async (path: string) => {
        const response = await fetch(`${app!.url}${path}`);
        assert.equal(response.status, 200, `${path}: ${await response.clone().text()}`);
        return (await response.json()) as { id?: string; key?: string | null };
      };
      assert.deepEqual(await get('/base/1'), { id: '1', key: 'base:1' });
      assert.deepEqual(await get('/base'), { key: 'base:none' }, 'a route with no parameters');
      assert.ok(walks > 0, 'the pipe ran');
      assert.deepEqual(await get('/plain/2'), { id: '2', key: null });
      assert.ok(
        seen.every((rest) => rest.every((arg) => arg === undefined)),
        `an override without @WithLock got ${JSON.stringify(seen)}`,
      );
      assert.deepEqual(await get('/own/3'), { id: '3', key: 'own:3' });
      assert.deepEqual(keyArgs, [1], 'the key function gets the handler arguments only');
    });
  });

  it('refuses static methods when decorated', () => {
    assert.throws(() => {
      class Static {
        @WithLock('static')
        static async run(): Promise<void> {}
      }
      return Static;
    }, /static method/);
    assert.throws(() => {
      class StaticLeader {
        @WhileLeader('static')
        static async run(): Promise<void> {}
      }
      return StaticLeader;
    }, /static method/);
  });

  it('refuses @WhileLeader with @Interval on one method, in either order, when the app boots', async () => {
    @Injectable()
    class Above {
      @Interval(60_000)
      @WhileLeader(uniqueKey('interval'))
      async work(): Promise<void> {}
    }
    @Injectable()
    class Below {
      @WhileLeader(uniqueKey('interval'))
      @Interval(60_000)
      async work(): Promise<void> {}
    }
    for (const Provider of [Above, Below]) {
      const module = await Test.createTestingModule({
        imports: [lockModule()],
        providers: [Provider],
      }).compile();
      try {
        await assert.rejects(module.init(), (error: unknown) => {
          assert.ok(error instanceof RedisLockConfigurationError, String(error));
          assert.match(error.message, /onBusy: 'skip'/);
          return true;
        });
      } finally {
        await closeFailed(module);
      }
    }
  });

  it('@WithLock runs through a LockService test double given with overrideProvider', async () => {
    const used: string[] = [];
    const fake = {
      using: async <T>(key: string, fn: (lock: unknown) => T) => {
        used.push(key);
        return fn({ key });
      },
    };
    @Injectable()
    class Orders {
      @WithLock('order:{0}')
      async pay(id: string): Promise<string> {
        return `paid ${id}`;
      }
    }
    const module = await Test.createTestingModule({
      imports: [lockModule()],
      providers: [Orders],
    })
      .overrideProvider(LockService)
      .useValue(fake)
      .compile();
    await module.init();
    try {
      assert.equal(await module.get(Orders).pay('7'), 'paid 7');
      assert.deepEqual(used, ['order:7']);
    } finally {
      await module.close();
    }
  });

  it('a handler answered early by a timeout interceptor still holds its lock until it returns', async () => {
    const key = uniqueKey('slow');
    let finished = false;
    class Timeout implements NestInterceptor {
      intercept(_context: ExecutionContext, next: CallHandler): Observable<unknown> {
        return next.handle().pipe(
          timeout(100),
          catchError(() => throwError(() => new RequestTimeoutException())),
        );
      }
    }
    @Controller('slow')
    class Slow {
      @Get()
      @WithLock(key)
      async run(): Promise<string> {
        await sleep(500);
        finished = true;
        return 'done';
      }
    }
    const module = await Test.createTestingModule({
      imports: [lockModule()],
      controllers: [Slow],
    }).compile();
    const nest = module.createNestApplication({ logger: false });
    nest.useGlobalInterceptors(new Timeout());
    await nest.listen(0, '127.0.0.1');
    try {
      const response = await fetch(`${await nest.getUrl()}/slow`);
      assert.equal(response.status, 408);
      const locks = module.get(LockService);
      assert.equal(await locks.isLocked(key), true, 'held while the handler runs on');
      assert.ok(await eventually(async () => finished && !(await locks.isLocked(key)), 2_000));
    } finally {
      await nest.close();
    }
  });

  it("a TCP RPC stream keeps its lock until the stream ends, even after its client unsubscribed (Nest's TCP transport never unsubscribes it), as the README says", async () => {
    const key = uniqueKey('rpc-stream');
    let emitted = 0;
    @Controller()
    class Feed {
      @MessagePattern('feed')
      @WithLock(key)
      feed(): Observable<number> {
        return interval(50).pipe(
          take(10),
          map((n) => (emitted = n + 1)),
        );
      }
    }
    const module = await Test.createTestingModule({
      imports: [lockModule()],
      controllers: [Feed],
    }).compile();
    const app = module.createNestApplication({ logger: false });
    const port = await freePort();
    app.connectMicroservice({ transport: Transport.TCP, options: { host: '127.0.0.1', port } });
    await app.startAllMicroservices();
    await app.init();
    const client = ClientProxyFactory.create({
      transport: Transport.TCP,
      options: { host: '127.0.0.1', port },
    });
    try {
      const locks = module.get(LockService);
      await new Promise<void>((resolve) => {
        const subscription = client.send<number>('feed', {}).subscribe((n) => {
          if (n < 2) return;
          subscription.unsubscribe();
          resolve();
        });
      });
      await client.close();
      assert.equal(await locks.isLocked(key), true, 'held after the client left');
      assert.ok(emitted < 10);
      assert.ok(await eventually(async () => emitted === 10 && !(await locks.isLocked(key))));
    } finally {
      await client.close();
      await app.close();
    }
  });

  describe('where these meet (found by review)', () => {
    it("a useValue object with onModuleDestroy shared by two running apps: closing one never stops the other's leader", async () => {
      const key = uniqueKey('shared-hook');
      const sharedClient = { onModuleDestroy(): void {} };
      let aborted = false;
      @Injectable()
      class Leader {
        @WhileLeader(key, { ttl: 5_000 })
        async work({ signal }: LeaderTerm): Promise<void> {
          await new Promise((resolve) => signal.addEventListener('abort', resolve));
          aborted = true;
        }
      }
      const boot = async (providers: unknown[]) => {
        const module = await Test.createTestingModule({
          imports: [lockModule()],
          providers: [{ provide: 'CLIENT', useValue: sharedClient }, ...(providers as [])],
        }).compile();
        await module.init();
        return module;
      };
      const first = await boot([Leader]);
      const second = await boot([]);
      try {
        assert.ok(await eventually(() => first.get(LockService).isLocked(key)));
        await second.close();
        await sleep(100);
        assert.equal(aborted, false, "the other app's close stopped this app's leader");
      } finally {
        await first.close();
      }
    });

    it('a module loaded lazily during startup neither turns off @WhileLeader nor misses its LockService', async () => {
      const key = uniqueKey('early-lazy');
      class Repo {
        @WithLock(`${key}:repo`)
        async save(): Promise<boolean> {
          return getCurrentLock() !== undefined;
        }
      }
      @Module({ providers: [{ provide: 'early', useFactory: () => new Repo() }] })
      class EarlyLazy {}
      let lazyRepo: Repo | undefined;
      @Injectable()
      class Loader {
        constructor(readonly loader: LazyModuleLoader) {}
        async onModuleInit(): Promise<void> {
          lazyRepo = (await this.loader.load(() => EarlyLazy)).get<Repo>('early');
        }
      }
      @Injectable()
      class Leader {
        @WhileLeader(key)
        async work({ signal }: LeaderTerm): Promise<void> {
          await new Promise((resolve) => signal.addEventListener('abort', resolve));
        }
      }
      const module = await Test.createTestingModule({
        imports: [lockModule()],
        providers: [Loader, Leader],
      }).compile();
      await module.init();
      try {
        assert.ok(await eventually(() => module.get(LockService).isLocked(key)), 'never led');
        assert.equal(await lazyRepo!.save(), true);
      } finally {
        await module.close();
      }
    });

    it('a startup refused for one @WhileLeader provider campaigns for none; after a failed startup, close() still stops lead() first', async () => {
      const refusedKey = uniqueKey('refused');
      @Injectable()
      class Good {
        @WhileLeader(refusedKey)
        async work({ signal }: LeaderTerm): Promise<void> {
          await new Promise((resolve) => signal.addEventListener('abort', resolve));
        }
      }
      @Injectable()
      class Bad {
        @WhileLeader(uniqueKey('bad'))
        @Interval(60_000)
        async work(): Promise<void> {}
      }
      const refused = await Test.createTestingModule({
        imports: [lockModule()],
        providers: [Good, Bad],
      }).compile();
      try {
        await assert.rejects(refused.init(), RedisLockConfigurationError);
        await sleep(200);
        assert.equal(await refused.get(LockService).isLocked(refusedKey), false);
      } finally {
        await closeFailed(refused);
      }

      const key = uniqueKey('failed-start');
      const late: number[] = [];
      @Injectable()
      class Db {
        open = true;
        onModuleDestroy(): void {
          this.open = false;
        }
      }
      @Injectable()
      class Campaigner {
        constructor(
          readonly locks: LockService,
          readonly db: Db,
        ) {}
        onModuleInit(): void {
          this.locks.lead(key, async ({ signal }) => {
            while (!signal.aborted) {
              if (!this.db.open) late.push(Date.now());
              await sleep(2);
            }
          });
        }
      }
      @Injectable()
      class Broken {
        onApplicationBootstrap(): void {
          throw new Error('cannot start');
        }
      }
      const failed = await Test.createTestingModule({
        imports: [lockModule()],
        providers: [Db, Campaigner, Broken],
      }).compile();
      await assert.rejects(failed.init(), /cannot start/);
      assert.ok(await eventually(() => failed.get(LockService).isLocked(key)));
      const closed = await closeFailed(failed);
      if (closed) assert.deepEqual(late, [], 'the leader ran on after its database was closed');
      else assert.equal(failed.get(Db).open, true, 'NestJS 11 destroyed nothing');
    });

    it('a leader that ignores its signal holds close() up to its TTL once, not once per provider hook', async () => {
      const key = uniqueKey('stubborn');
      // Each in a module of its own: Nest destroys modules one after another.
      const features = Array.from({ length: 4 }, () => {
        @Injectable()
        class Hooked {
          onModuleDestroy(): void {}
        }
        @Module({ providers: [Hooked] })
        class Feature {}
        return Feature;
      });
      let working: Promise<void> | undefined;
      @Injectable()
      class Stubborn {
        @WhileLeader(key, { ttl: 500 })
        async work(): Promise<void> {
          working = sleep(2_000); // ignores its signal
          await working;
        }
      }
      const module = await Test.createTestingModule({
        imports: [lockModule(), ...features],
        providers: [Stubborn],
      }).compile();
      await module.init();
      assert.ok(await eventually(() => module.get(LockService).isLocked(key)));
      const { restore } = LogCapture.install();
      try {
        const watch = watchStalls();
        const started = performance.now();
        await module.close();
        const took = performance.now() - started;
        // It waits for the work up to the term's TTL, not longer (the work ignores its signal
        // for 2 s), then releases and closes on a healthy Redis: a few round trips.
        assertWithin(took, 500, watch, 'close() with a 500 ms TTL', 500 - 5);
        watch.stop();
      } finally {
        restore();
        await working;
      }
    });

    it("a frozen useValue with @WithLock is refused with RedisLockConfigurationError; a test double leaves providers' onModuleDestroy running", async () => {
      class Frozen {
        @WithLock('frozen')
        async run(): Promise<void> {}
      }
      const frozen = await Test.createTestingModule({
        imports: [lockModule()],
        providers: [{ provide: Frozen, useValue: Object.freeze(new Frozen()) }],
      }).compile();
      await assert.rejects(frozen.init(), RedisLockConfigurationError);
      await closeFailed(frozen);

      let destroyed = 0;
      @Injectable()
      class Repo {
        onModuleDestroy(): void {
          destroyed++;
        }
      }
      const module = await Test.createTestingModule({
        imports: [lockModule()],
        providers: [Repo],
      })
        .overrideProvider(LockService)
        .useValue({ using: async <T>(_key: string, fn: () => T) => fn() })
        .compile();
      await module.init();
      await module.close();
      assert.equal(destroyed, 1);
    });

    it('a decorator of yours that wraps a locked handler from above keeps its 409 and its key arguments', async () => {
      const key = uniqueKey('traced');
      const keyArgs: number[] = [];
      function Traced(): MethodDecorator {
        return (_target, _key, descriptor: PropertyDescriptor) => {
          const original = descriptor.value as (...args: unknown[]) => unknown;
          descriptor.value = function (this: unknown, ...args: unknown[]) {
            return original.apply(this, args);
          };
          for (const name of Reflect.getOwnMetadataKeys(original)) {
            Reflect.defineMetadata(name, Reflect.getOwnMetadata(name, original), descriptor.value);
          }
          return descriptor;
        };
      }
      @Controller('traced')
      class TracedController {
        @Get(':id')
        @Traced()
        @WithLock({
          key: (...args: unknown[]) => {
            keyArgs.push(args.length);
            return `${key}:${String(args[0])}`;
          },
          acquireTimeout: 100,
        })
        async get(@Param('id') id: string): Promise<string> {
          return id;
        }
      }
      const module = await Test.createTestingModule({
        imports: [lockModule()],
        controllers: [TracedController],
      }).compile();
      const nest = module.createNestApplication({ logger: false });
      await nest.listen(0, '127.0.0.1');
      try {
        const url = await nest.getUrl();
        assert.equal((await fetch(`${url}/traced/1`)).status, 200);
        const held = await module.get(LockService).acquire(`${key}:2`, { ttl: 5_000 });
        const busy = await fetch(`${url}/traced/2`);
        assert.equal(busy.status, 409);
        assert.ok(busy.headers.get('retry-after'));
        await held.release();
        assert.deepEqual(keyArgs, [1, 1]);
      } finally {
        await nest.close();
      }
    });

    it('a handler parameter with a default value keeps its own slot: a pipe that rebuilds values by their declared type never gets the context token', async () => {
      const key = uniqueKey('default');
      class Page {
        size = 10;
      }
      /** Rebuilds every argument declared as a class into an instance of it. */
      class RebuildPipe implements PipeTransform {
        transform(value: unknown, { metatype }: { metatype?: unknown }): unknown {
          return metatype === Page ? Object.assign(new Page(), value) : value;
        }
      }
      @Controller('paged')
      class Paged {
        @Get(':id')
        @WithLock({ key: `${key}:{0}`, acquireTimeout: 100 })
        async get(@Param('id') id: string, page: Page = new Page()): Promise<unknown> {
          return { id, size: page.size };
        }
      }
      const module = await Test.createTestingModule({
        imports: [lockModule()],
        controllers: [Paged],
      }).compile();
      const nest = module.createNestApplication({ logger: false });
      nest.useGlobalPipes(new RebuildPipe());
      await nest.listen(0, '127.0.0.1');
      try {
        const url = await nest.getUrl();
        assert.deepEqual(await (await fetch(`${url}/paged/1`)).json(), { id: '1', size: 10 });
        const held = await module.get(LockService).acquire(`${key}:2`, { ttl: 5_000 });
        assert.equal((await fetch(`${url}/paged/2`)).status, 409);
        await held.release();
      } finally {
        await nest.close();
      }
    });

    it('@Interval above or below @WithLock: the scheduler runs the locked method in either order', async () => {
      const ran: Record<string, (string | undefined)[]> = { above: [], below: [] };
      const keys = { above: uniqueKey('above'), below: uniqueKey('below') };
      @Injectable()
      class Jobs {
        @Interval(40)
        @WithLock({ key: keys.above, onBusy: 'skip' })
        async above(): Promise<void> {
          ran.above.push(getCurrentLock()?.key);
        }
        @WithLock({ key: keys.below, onBusy: 'skip' })
        @Interval(40)
        async below(): Promise<void> {
          ran.below.push(getCurrentLock()?.key);
        }
      }
      const module = await Test.createTestingModule({
        imports: [lockModule(), ScheduleModule.forRoot()],
        providers: [Jobs],
      }).compile();
      await module.init();
      try {
        assert.ok(await eventually(() => ran.above.length >= 2 && ran.below.length >= 2));
      } finally {
        await module.close();
      }
      assert.ok(
        ran.above.every((key) => key === keys.above),
        JSON.stringify(ran.above),
      );
      assert.ok(
        ran.below.every((key) => key === keys.below),
        JSON.stringify(ran.below),
      );
    });

    it("@WithLock on a scheduled job without onBusy: 'skip' is warned about once at startup (every instance would run every fire)", async () => {
      @Injectable()
      class Reports {
        @Interval(60_000)
        @WithLock({ key: uniqueKey('every-instance') })
        async hourly(): Promise<void> {}
        @Interval(60_000)
        @WithLock({ key: uniqueKey('once'), onBusy: 'skip' })
        async daily(): Promise<void> {}
      }
      const module = await Test.createTestingModule({
        imports: [lockModule()],
        providers: [Reports],
      }).compile();
      const { capture, restore } = LogCapture.install();
      try {
        await module.init();
        const warned = capture.lines.filter(
          ({ level, message }) => level === 'warn' && message.includes('scheduled job'),
        );
        assert.equal(warned.length, 1, JSON.stringify(capture.lines));
        assert.match(warned[0].message, /Reports\.hourly/);
      } finally {
        restore();
        await module.close();
      }
    });
  });
});
