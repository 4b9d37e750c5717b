import assert from 'node:assert/strict';
import http from 'node:http';
import http2 from 'node:http2';
import net from 'node:net';
import { after, before, describe, it } from 'node:test';
import {
  Controller,
  Get,
  HttpException,
  Injectable,
  Module,
  Param,
  ParseIntPipe,
  SetMetadata,
  UseGuards,
  UseFilters,
  Catch,
  type ArgumentsHost,
  type ExceptionFilter,
  type CanActivate,
  type INestApplication,
  Query,
} from '@nestjs/common';
import { Reflector } from '@nestjs/core';
import { ClientProxyFactory, MessagePattern, TcpContext, Transport } from '@nestjs/microservices';
import { FastifyAdapter } from '@nestjs/platform-fastify';
import { WsAdapter } from '@nestjs/platform-ws';
import {
  WsException,
  MessageBody,
  SubscribeMessage,
  WebSocketGateway,
  type WsResponse,
} from '@nestjs/websockets';
import { WebSocket } from 'ws';
import { Test } from '@nestjs/testing';
import { Redis } from 'ioredis';
import { defer, delay, firstValueFrom, Observable, of, throwError } from 'rxjs';
import {
  getCurrentLock,
  LockAcquireTimeoutError,
  LockKeyResolutionError,
  LockService,
  RedisLockConfigurationError,
  RedisLockModule,
  WithLock,
  type RedisLockModuleOptions,
  type WithLockOptions,
} from '../../lib/index.js';
import { ACQUIRE_SCRIPT } from '../../lib/redis/lock.scripts.js';
import { eventually, sleep, uniqueKey, waitingCallers } from '../support/lock-module.js';
import { monitorRedis, scriptCalls } from '../support/redis-monitor.js';
import { freePort, startRedis, type RedisServer } from '../support/redis-server.js';
import { assertWithin, watchStalls } from '../support/timing.js';

const CUSTOM = 'test:custom-metadata';
let guardCalls = 0;
class CountingGuard implements CanActivate {
  canActivate(): boolean {
    guardCalls++;
    return true;
  }
}

@Injectable()
class AccountsService {
  @WithLock({ key: 'acct:{0.id}', acquireTimeout: 200 })
  async debit(
    _account: { id?: unknown },
    amount: number,
  ): Promise<{ fence: number | undefined; amount: number }> {
    await sleep(20);
    return { fence: getCurrentLock()?.fence, amount };
  }

  @WithLock({ key: (tenant: string, id: number) => `${tenant}/invoice/${id}`, acquireTimeout: 200 })
  async invoice(tenant: string, id: number): Promise<string> {
    return getCurrentLock()!.key + '|' + `${tenant}/${id}`;
  }

  @WithLock({ key: 'feed:{0}', acquireTimeout: 200 })
  feed(_name: string): Observable<number> {
    return defer(() => of(1, 2, 3).pipe(delay(100)));
  }

  @WithLock({ key: 'broken-feed:{0}', acquireTimeout: 200 })
  brokenFeed(_name: string): Observable<number> {
    return defer(() => throwError(() => new RangeError('feed broke')).pipe(delay(50)));
  }

  @WithLock({ key: 'slow:{0}', ttl: 300 })
  async slow(_name: string): Promise<boolean> {
    await sleep(900); // three TTLs
    return getCurrentLock()!.signal.aborted;
  }

  @WithLock({ key: 'bad:{0}', acquireTimeout: 200 })
  async failing(_name: string): Promise<never> {
    throw new TypeError('domain failure');
  }

  /** The short form: (key, ttl, acquireTimeout). */
  @WithLock('short:{0}', 7_000, 150)
  async short(_name: string): Promise<{ key: string; ttl: number }> {
    const lock = getCurrentLock()!;
    return { key: lock.key, ttl: Math.round(lock.expiresAt - performance.now()) };
  }

  /** The short form with the key alone: the module's defaults. */
  @WithLock((name: string) => `short-fn:${name}`)
  async shortKeyOnly(_name: string): Promise<string> {
    return getCurrentLock()!.key;
  }

  /** Several keys: both accounts of a transfer, whichever way it goes. */
  @WithLock({ key: ['acct:{0.from}', 'acct:{0.to}'], acquireTimeout: 2_000 })
  async transfer(_move: { from?: unknown; to?: unknown }): Promise<{
    keys: readonly string[];
    fences: Readonly<Record<string, number>>;
  }> {
    const lock = getCurrentLock()!;
    transfersInside++;
    if (transfersInside > 1) transferOverlaps++;
    await sleep(5);
    transfersInside--;
    return { keys: lock.keys, fences: lock.fences };
  }

  /** The short form takes a key list too, with functions among the templates. */
  @WithLock(['pair:{0}', (_a: string, b: string) => `pair:${b}`], 5_000, 150)
  async pairShort(_a: string, _b: string): Promise<readonly string[]> {
    return getCurrentLock()!.keys;
  }
}
let transfersInside = 0;
let transferOverlaps = 0;

/** Records what reaches the gateway's filter and sends it to native ws clients (NestJS 11's default filter does not). */
const wsExceptions: unknown[] = [];
@Catch()
class RecordingWsFilter implements ExceptionFilter {
  catch(exception: unknown, host: ArgumentsHost): void {
    wsExceptions.push(exception);
    const data = exception instanceof WsException ? exception.getError() : { status: 'error' };
    host
      .switchToWs()
      .getClient<WebSocket>()
      .send(JSON.stringify({ event: 'exception', data }));
  }
}

/** The SKUs the patient handlers ran for. */
const ran: string[] = [];

/** Whether `app`'s LockService has callers waiting for `key` (internal: issue 40's inspect() will say). */
function hasWaiters(app: INestApplication, key: string): boolean {
  const service: unknown = app.get(LockService);
  return (
    service as { engine: { parts: { backend: { hasWaiters(key: string): boolean } } } }
  ).engine.parts.backend.hasWaiters(key);
}

@WebSocketGateway()
@UseFilters(RecordingWsFilter)
class StockGateway {
  @SubscribeMessage('reserve')
  @WithLock({ key: 'ws:{0.sku}', acquireTimeout: 200 })
  async reserve(@MessageBody() body: { sku: string }): Promise<WsResponse<string>> {
    return { event: 'reserved', data: body.sku };
  }

  /** Waits up to 5 s for its lock: long enough for its client to go away meanwhile. */
  @SubscribeMessage('reserve-patient')
  @WithLock({ key: 'ws:{0.sku}', acquireTimeout: 5_000 })
  async reservePatient(@MessageBody() body: { sku: string }): Promise<WsResponse<string>> {
    ran.push(body.sku);
    return { event: 'reserved', data: body.sku };
  }

  /** No parameter decorators: Nest passes the transport's arguments, (client, data). */
  @SubscribeMessage('reserve-raw')
  @WithLock({ key: 'ws:{1.sku}', acquireTimeout: 200 })
  async reserveRaw(client: unknown, body: { sku: string }): Promise<WsResponse<unknown>> {
    return {
      event: 'reserved-raw',
      data: [typeof (client as { send?: unknown }).send === 'function', body.sku],
    };
  }
}

@Controller()
class RawMessages {
  /** No parameter decorators: Nest passes the transport's arguments, (data, context). */
  @MessagePattern('reserve-raw')
  @WithLock({ key: 'rpc:{0.sku}', acquireTimeout: 200 })
  async reserveRaw(data: { sku: string }, context: unknown): Promise<unknown[]> {
    return [data.sku, context instanceof TcpContext];
  }

  @MessagePattern('reserve-patient')
  @WithLock({ key: 'rpc:{0.sku}', acquireTimeout: 5_000 })
  async reservePatient(data: { sku: string }): Promise<string> {
    ran.push(data.sku);
    return data.sku;
  }
}

@Injectable()
class UndeclaredStreams {
  // No return type annotation: TypeScript records none, so the lock cannot be taken on subscribe.
  @WithLock({ key: 'undeclared:{0}' })
  stream(_name: string) {
    return of(1);
  }

  @WithLock({ key: 'undeclared:{0}' })
  async later(_name: string): Promise<Observable<number>> {
    return of(1);
  }
}

@Controller('orders')
class OrdersController {
  constructor(private readonly accounts: AccountsService) {}

  @WithLock({ key: 'order:{0}', acquireTimeout: 200 })
  @Get('above/:id')
  @UseGuards(CountingGuard)
  @SetMetadata(CUSTOM, 'above')
  async above(
    @Param('id', ParseIntPipe) id: number,
  ): Promise<{ id: number; type: string; fence?: number }> {
    return { id, type: typeof id, fence: getCurrentLock()?.fence };
  }

  @SetMetadata(CUSTOM, 'below')
  @UseGuards(CountingGuard)
  @Get('below/:id')
  @WithLock({ key: 'order:{0}', acquireTimeout: 200 })
  async below(@Param('id', ParseIntPipe) id: number): Promise<{ id: number; type: string }> {
    return { id, type: typeof id };
  }

  @Get('locked/:id')
  @WithLock({ key: 'order:{0}', acquireTimeout: 200, timeoutStatus: 423 })
  async locked423(@Param('id') id: string): Promise<string> {
    return id;
  }

  @Get('custom/:id')
  @WithLock({
    key: 'order:{0}',
    acquireTimeout: 200,
    timeoutException: () => new HttpException({ reason: 'custom' }, 418),
  })
  async custom(@Param('id') id: string): Promise<string> {
    return id;
  }

  /** No parameters: Nest passes none, and the decorator adds none. */
  @Get('constant')
  @WithLock({ key: 'order:constant', acquireTimeout: 200 })
  async constant(...args: unknown[]): Promise<{ args: number }> {
    return { args: args.length };
  }

  @Get('missing')
  @WithLock({ key: 'order:{0.id}', acquireTimeout: 200 })
  async missing(@Query() query: { id?: string }): Promise<string> {
    void query; // no ?id=: {0.id} resolves to undefined
    return 'never';
  }

  /** A value from the URL that spells another route's key ('42:refund'). */
  @Get('pay/:id')
  @WithLock({ key: 'order:{0}', acquireTimeout: 200 })
  async pay(@Param('id') id: string): Promise<{ id: string; key: string | undefined }> {
    return { id, key: getCurrentLock()?.key };
  }

  @Get('patient/:id')
  @WithLock({ key: 'order:{0}', acquireTimeout: 5_000 })
  async patient(@Param('id') id: string): Promise<string> {
    ran.push(id);
    return id;
  }

  @Get('short-key/:id')
  @WithLock({ key: 'order:{0}', acquireTimeout: 200, maxKeyLength: 16 })
  async shortKey(@Param('id') id: string): Promise<string> {
    return id;
  }

  @Get('allowed/:id')
  @WithLock({
    key: 'order:{0}',
    acquireTimeout: 200,
    validateKey: (key) => /^order:\d+$/.test(key),
  })
  async allowed(@Param('id') id: string): Promise<string> {
    return id;
  }

  @Get('same-key/:id')
  @WithLock({ key: 'acct:{0}', acquireTimeout: 200 })
  async sameKey(@Param('id') id: string): Promise<unknown> {
    return this.accounts.debit({ id }, 5);
  }
}

@Module({ controllers: [OrdersController], providers: [AccountsService, UndeclaredStreams] })
class OrdersModule {}

@Module({ providers: [StockGateway] })
class GatewayModule {}

async function bootApp(
  server: RedisServer,
  options: Partial<RedisLockModuleOptions> = {},
  adapter?: FastifyAdapter,
): Promise<INestApplication> {
  const module = await Test.createTestingModule({
    imports: [
      RedisLockModule.forRoot({ connection: server.url, isGlobal: true, ...options }),
      OrdersModule,
    ],
  }).compile();
  const app = adapter ? module.createNestApplication(adapter) : module.createNestApplication();
  await app.listen(0, '127.0.0.1');
  return app;
}

const appUrl = async (app: INestApplication): Promise<string> =>
  (await app.getUrl()).replace('[::1]', '127.0.0.1');

describe('@WithLock', () => {
  let server: RedisServer;
  let redis: Redis;

  before(async () => {
    server = await startRedis();
    redis = new Redis(server.port, server.host);
  });
  after(async () => {
    redis?.disconnect();
    await server?.stop();
  });

  for (const [adapterName, createAdapter] of [
    ['Express', () => undefined],
    ['Fastify', () => new FastifyAdapter()],
  ] as const) {
    describe(`on controller handlers (${adapterName})`, () => {
      let app: INestApplication;
      let url: string;
      let locks: LockService;

      before(async () => {
        app = await bootApp(server, {}, createAdapter());
        url = await appUrl(app);
        locks = app.get(LockService);
      });
      after(async () => {
        await app?.close();
      });

      it('requests on one keep-alive connection wait one after another; a hang-up ends the wait of the request on it, not of one on another connection', async () => {
        const id = String(Math.floor(Math.random() * 1e9));
        const key = `order:${id}`;
        // One connection, kept alive between requests.
        const agent = new http.Agent({ keepAlive: true, maxSockets: 1 });
        const send = (): { request: http.ClientRequest; answer: Promise<number | 'gone'> } => {
          const request = http.get(`${url}/orders/patient/${id}`, { agent });
          const answer = new Promise<number | 'gone'>((resolve) => {
            request.on('response', (response) => {
              response.resume();
              response.on('end', () => resolve(response.statusCode ?? 0));
            });
            request.on('error', () => resolve('gone'));
          });
          return { request, answer };
        };
        try {
          for (let turn = 0; turn < 2; turn++) {
            const held = await locks.acquire(key, { ttl: 10_000 });
            const { request, answer } = send();
            assert.ok(await eventually(() => waitingCallers(locks, key) === 1), 'it waits');
            assert.equal(request.reusedSocket, turn > 0, 'the same connection each turn');
            await held.release();
            assert.equal(await answer, 200, `turn ${turn}: answered once the lock was free`);
          }
          const held = await locks.acquire(key, { ttl: 10_000 });
          try {
            const { request, answer } = send();
            const other = fetch(`${url}/orders/patient/${id}`);
            assert.ok(await eventually(() => waitingCallers(locks, key) === 2), 'both wait');
            assert.equal(request.reusedSocket, true);
            const watch = watchStalls();
            const gone = performance.now();
            request.destroy();
            assert.equal(await answer, 'gone');
            assert.ok(
              await eventually(() => waitingCallers(locks, key) === 1, 5_000),
              'the wait of the request whose client hung up ends',
            );
            // With the connection, not at the route's 5 s acquireTimeout.
            // A tenth of the route's 5 s acquireTimeout: the server has a closed connection to
            // notice and the test polls (a bound of 0 failed the sample's e2e test in CI).
            assertWithin(performance.now() - gone, 500, watch, 'the end of the wait');
            watch.stop();
            await held.release();
            assert.equal((await other).status, 200, 'the request on another connection goes on');
          } finally {
            await held.release();
          }
        } finally {
          agent.destroy();
        }
      });

      it('pipelined requests on one connection: its hang-up ends the waits of both, and neither handler runs', async () => {
        const id = String(Math.floor(Math.random() * 1e9));
        const key = `order:${id}`;
        const held = await locks.acquire(key, { ttl: 10_000 });
        try {
          const { port } = new URL(url);
          const socket = net.connect(Number(port), '127.0.0.1');
          socket.on('error', () => {});
          await new Promise((resolve) => socket.once('connect', resolve));
          // Two requests in one write: the second's response has no connection of its own yet.
          const request = `GET /orders/patient/${id} HTTP/1.1\r\nHost: test\r\n\r\n`;
          socket.write(request + request);
          assert.ok(await eventually(() => waitingCallers(locks, key) === 2), 'both wait');
          const watch = watchStalls();
          const gone = performance.now();
          socket.destroy();
          assert.ok(
            await eventually(() => waitingCallers(locks, key) === 0, 5_000),
            `the waits end (${waitingCallers(locks, key)} still wait)`,
          );
          // With the connection, not at the route's 5 s acquireTimeout.
          // A tenth of the route's acquireTimeout (see the keep-alive test).
          assertWithin(performance.now() - gone, 500, watch, 'the end of the waits');
          watch.stop();
        } finally {
          await held.release();
        }
        assert.ok(!ran.includes(id), 'a handler ran for a caller that was gone');
      });

      for (const order of ['above', 'below'] as const) {
        it(`works with @WithLock ${order} @Get, guards and metadata, after pipes`, async () => {
          const calls = guardCalls;
          const id = Math.floor(Math.random() * 1e9);
          const response = await fetch(`${url}/orders/${order}/${id}`);
          assert.equal(response.status, 200);
          const body = (await response.json()) as { id: number; type: string };
          assert.deepEqual(
            [body.id, body.type],
            [id, 'number'],
            'the key and the handler see piped arguments',
          );
          assert.equal(guardCalls, calls + 1, 'the guard still runs');
          const handler = OrdersController.prototype[order];
          assert.equal(app.get(Reflector).get(CUSTOM, handler), order, 'other metadata survives');

          const held = await locks.acquire(`order:${id}`);
          try {
            assert.equal(
              (await fetch(`${url}/orders/${order}/${id}`)).status,
              409,
              'the route is locked',
            );
          } finally {
            await held.release();
          }
        });
      }

      it('takes the lock exactly once per call', async () => {
        const id = String(Math.floor(Math.random() * 1e9));
        const monitor = await monitorRedis(server.port);
        try {
          assert.equal((await fetch(`${url}/orders/above/${id}`)).status, 200);
          await sleep(50);
          assert.equal(scriptCalls(monitor.commands, ACQUIRE_SCRIPT, `lock:{order:${id}}`), 1);
        } finally {
          monitor.stop();
        }
      });

      it('decorator-level timeoutStatus and timeoutException change the answer', async () => {
        const id = uniqueKey();
        const held = await locks.acquire(`order:${id}`, { ttl: 5_000 });
        try {
          const locked = await fetch(`${url}/orders/locked/${id}`);
          assert.equal(locked.status, 423);
          assert.ok(locked.headers.get('retry-after'));
          const custom = await fetch(`${url}/orders/custom/${id}`);
          assert.equal(custom.status, 418);
          assert.deepEqual(await custom.json(), { reason: 'custom' });
        } finally {
          await held.release();
        }
      });

      it('a handler without parameters gets none, and its timeout answers 409 with Retry-After', async () => {
        const started = performance.now();
        const free = await fetch(`${url}/orders/constant`);
        const freeMs = performance.now() - started; // the route's hold lasted at most this
        assert.equal(free.status, 200);
        assert.deepEqual(await free.json(), { args: 0 });
        const held = await locks.acquire('order:constant', { ttl: 5_000 });
        try {
          const busy = await fetch(`${url}/orders/constant`);
          assert.equal(busy.status, 409);
          // The route's own hold just now: retry in 1 s (more only if that request stalled), not
          // after the 5 s TTL.
          const seconds = Number(busy.headers.get('retry-after'));
          assert.ok(
            seconds >= 1 && seconds <= Math.max(1, Math.ceil(freeMs / 1_000)) && seconds < 5,
            `Retry-After ${seconds} after a hold of at most ${freeMs.toFixed(0)} ms`,
          );
        } finally {
          await held.release();
        }
      });

      it("Retry-After is how long this process saw the key held lately, at most the holder's remaining TTL, else that TTL", async () => {
        const id = Math.floor(Math.random() * 1e9);
        const retryAfter = async (): Promise<string | null> => {
          const busy = await fetch(`${url}/orders/above/${id}`);
          assert.equal(busy.status, 409);
          return busy.headers.get('retry-after');
        };
        // Nothing seen of this key yet: the holder's remaining TTL (10 s less what passed since).
        const before = performance.now();
        let held = await locks.acquire(`order:${id}`, { ttl: 10_000 });
        const granted = performance.now();
        const first = Number(await retryAfter());
        const remaining = 10_000 - (performance.now() - before);
        assert.ok(first <= 10 && first >= Math.ceil(remaining / 1_000), `Retry-After ${first}`);
        await sleep(1_100);
        const releasing = performance.now();
        await held.release(); // a hold of ~1.1 s, as this process measures it
        const released = performance.now();
        held = await locks.acquire(`order:${id}`, { ttl: 10_000 });
        try {
          // The hold seen (between what the test measured on either side of it), not the TTL.
          const seen = Number(await retryAfter());
          const [low, high] = [releasing - granted, released - before].map((ms) =>
            Math.ceil(ms / 1_000),
          );
          assert.ok(
            seen >= low && seen <= high && seen < 10,
            `Retry-After ${seen}: ${low}–${high}`,
          );
        } finally {
          await held.release();
        }
        // A holder whose lock runs out sooner than the holds seen: its remaining TTL (≥ 1 s).
        held = await locks.acquire(`order:${id}`, { ttl: 800 });
        try {
          assert.equal(await retryAfter(), '1');
        } finally {
          await held.release();
        }
      });

      it('a handler called from code gets LockAcquireTimeoutError itself, not the HTTP answer', async () => {
        const id = uniqueKey();
        const held = await locks.acquire(`order:${id}`, { ttl: 5_000 });
        try {
          await assert.rejects(app.get(OrdersController).locked423(id), LockAcquireTimeoutError);
        } finally {
          await held.release();
        }
      });

      it('a placeholder resolving to undefined answers 400, naming the placeholder, and locks nothing', async () => {
        const response = await fetch(`${url}/orders/missing`);
        assert.equal(response.status, 400);
        assert.deepEqual(await response.json(), {
          statusCode: 400,
          error: 'Bad Request',
          message:
            'The request does not name the resource to lock: {0.id} of the lock key is missing or not a string or number.',
        });
        assert.equal(await redis.exists('lock:{order:undefined}'), 0);
      });

      it("a value from the URL cannot spell another route's key: order:{0} with 42:refund is not order:42:refund", async () => {
        const id = Math.floor(Math.random() * 1e9);
        const refund = await locks.acquire(`order:${id}:refund`, { ttl: 5_000 });
        try {
          const response = await fetch(`${url}/orders/pay/${id}%3Arefund`);
          assert.equal(response.status, 200);
          assert.deepEqual(await response.json(), {
            id: `${id}:refund`,
            key: `order:${id}%3Arefund`,
          });
        } finally {
          await refund.release();
        }
      });

      it('a key over maxKeyLength, or one validateKey refuses, answers 400 without the key and locks nothing', async () => {
        const long = await fetch(`${url}/orders/short-key/${'9'.repeat(11)}`);
        assert.equal(long.status, 400);
        assert.deepEqual(await long.json(), {
          statusCode: 400,
          error: 'Bad Request',
          message:
            'The request names a resource whose lock key is too long (17 characters, at most 16).',
        });
        assert.equal((await fetch(`${url}/orders/short-key/${'9'.repeat(10)}`)).status, 200);
        const refused = await fetch(`${url}/orders/allowed/x1`);
        assert.equal(refused.status, 400);
        const body = await refused.text();
        assert.match(body, /cannot be locked/);
        assert.doesNotMatch(body, /x1/);
        assert.equal((await fetch(`${url}/orders/allowed/12`)).status, 200);
        assert.deepEqual(await redis.keys('lock:{order:x1}*'), []);
      });

      it("a key over the module's maxKeyLength (512 by default) answers 400", async () => {
        const response = await fetch(`${url}/orders/missing?id=${'7'.repeat(600)}`);
        assert.equal(response.status, 400);
        assert.match(await response.text(), /too long \(606 characters, at most 512\)/);
      });

      it('a locked handler calling a locked provider method with the same key completes', async () => {
        const response = await fetch(`${url}/orders/same-key/${uniqueKey()}`);
        assert.equal(response.status, 200);
        assert.equal(((await response.json()) as { amount: number }).amount, 5);
      });
    });
  }

  describe('on HTTP/2 (Fastify)', () => {
    it('a cancelled stream ends its own wait and no other; a closed session ends the waits of its streams; no handler runs for them', async () => {
      // h2c (HTTP/2 without TLS, as a proxy in front of the app speaks it).
      const adapter = new FastifyAdapter({ http2: true } as ConstructorParameters<
        typeof FastifyAdapter
      >[0]) as unknown as FastifyAdapter;
      const app = await bootApp(server, {}, adapter);
      const locks = app.get(LockService);
      const id = String(Math.floor(Math.random() * 1e9));
      const key = `order:${id}`;
      const origin = (await appUrl(app)).replace('https:', 'http:');
      const sessions = [http2.connect(origin), http2.connect(origin)];
      for (const session of sessions) session.on('error', () => {});
      /** A request on `session`: its status, or 'gone' if its stream closed without one. */
      const get = (session: http2.ClientHttp2Session) => {
        const stream = session.request({ ':path': `/orders/patient/${id}` });
        stream.on('error', () => {});
        const answer = new Promise<number | 'gone'>((resolve) => {
          let status: number | undefined;
          stream.on('response', (headers) => (status = Number(headers[':status'])));
          stream.resume();
          stream.on('close', () => resolve(status ?? 'gone'));
        });
        return { stream, answer };
      };
      try {
        // Answered at all (h2c), before anything is held.
        assert.equal(await get(sessions[0]).answer, 200);
        const ranBefore = ran.filter((sku) => sku === id).length;
        const held = await locks.acquire(key, { ttl: 10_000 });
        try {
          const cancelled = get(sessions[0]);
          const kept = get(sessions[0]);
          const [cut1, cut2] = [get(sessions[1]), get(sessions[1])];
          assert.ok(await eventually(() => waitingCallers(locks, key) === 4), 'all four wait');
          const watch = watchStalls();
          const gone = performance.now();
          cancelled.stream.close(http2.constants.NGHTTP2_CANCEL);
          assert.ok(
            await eventually(() => waitingCallers(locks, key) === 3, 5_000),
            'the cancelled stream stops waiting',
          );
          sessions[1].destroy();
          assert.ok(
            await eventually(() => waitingCallers(locks, key) === 1, 5_000),
            `the closed session's streams stop waiting (${waitingCallers(locks, key)} wait)`,
          );
          // With their streams, not at the route's 5 s acquireTimeout.
          // A tenth of the route's acquireTimeout (see the keep-alive test).
          assertWithin(performance.now() - gone, 500, watch, 'the end of the waits');
          watch.stop();
          await held.release();
          assert.equal(await kept.answer, 200, 'the stream that stayed is answered');
          assert.deepEqual(await Promise.all([cancelled.answer, cut1.answer, cut2.answer]), [
            'gone',
            'gone',
            'gone',
          ]);
        } finally {
          await held.release();
        }
        assert.equal(
          ran.filter((sku) => sku === id).length - ranBefore,
          1,
          'the handler ran once: for the stream that stayed',
        );
      } finally {
        for (const session of sessions) session.destroy();
        await app.close();
      }
    });
  });

  describe('on WebSocket handlers', () => {
    it('locks the handler and answers a timeout with a WsException', async () => {
      const module = await Test.createTestingModule({
        imports: [
          RedisLockModule.forRoot({ connection: server.url, isGlobal: true }),
          GatewayModule,
        ],
      }).compile();
      const app = module.createNestApplication();
      app.useWebSocketAdapter(new WsAdapter(app));
      await app.listen(0, '127.0.0.1');
      const socket = new WebSocket((await appUrl(app)).replace('http', 'ws'));
      const replies: { event: string; data: unknown }[] = [];
      socket.on('message', (data: Buffer) => replies.push(JSON.parse(data.toString())));
      try {
        await new Promise((resolve, reject) => socket.once('open', resolve).once('error', reject));
        const sku = uniqueKey();
        socket.send(JSON.stringify({ event: 'reserve', data: { sku } }));
        assert.ok(await eventually(() => replies.length === 1, 2_000));
        assert.deepEqual(replies[0], { event: 'reserved', data: sku });

        const held = await app.get(LockService).acquire(`ws:${sku}`);
        socket.send(JSON.stringify({ event: 'reserve', data: { sku } }));
        assert.ok(await eventually(() => replies.length === 2, 2_000));
        await held.release();
        assert.ok(wsExceptions.at(-1) instanceof WsException);
        assert.equal(replies[1].event, 'exception');
        assert.equal((replies[1].data as { code: string }).code, 'LOCK_TIMEOUT');
        // The key came from the client's message: the answer does not echo it.
        assert.doesNotMatch(JSON.stringify(replies[1].data), new RegExp(sku));
        assert.match((replies[1].data as { message: string }).message, /^The resource is busy/);

        // Without parameter decorators: the raw (client, data), and the same answer.
        socket.send(JSON.stringify({ event: 'reserve-raw', data: { sku } }));
        assert.ok(await eventually(() => replies.length === 3, 2_000));
        assert.deepEqual(replies[2], { event: 'reserved-raw', data: [true, sku] });
        const again = await app.get(LockService).acquire(`ws:${sku}`);
        socket.send(JSON.stringify({ event: 'reserve-raw', data: { sku } }));
        assert.ok(await eventually(() => replies.length === 4, 2_000));
        await again.release();
        assert.equal((replies[3].data as { code: string }).code, 'LOCK_TIMEOUT');
      } finally {
        socket.close();
        await app.close();
      }
    });

    it('a wait ends when the client closes its socket: the handler never runs', async () => {
      const module = await Test.createTestingModule({
        imports: [
          RedisLockModule.forRoot({ connection: server.url, isGlobal: true }),
          GatewayModule,
        ],
      }).compile();
      const app = module.createNestApplication();
      app.useWebSocketAdapter(new WsAdapter(app));
      await app.listen(0, '127.0.0.1');
      const sku = uniqueKey();
      const held = await app.get(LockService).acquire(`ws:${sku}`, { ttl: 10_000 });
      try {
        const socket = new WebSocket((await appUrl(app)).replace('http', 'ws'));
        await new Promise((resolve, reject) => socket.once('open', resolve).once('error', reject));
        socket.send(JSON.stringify({ event: 'reserve-patient', data: { sku } }));
        assert.ok(await eventually(() => hasWaiters(app, `ws:${sku}`)), 'it waits');
        const watch = watchStalls();
        const closed = performance.now();
        socket.terminate();
        assert.ok(await eventually(() => !hasWaiters(app, `ws:${sku}`), 10_000), 'the wait ends');
        // With the socket, not at its 5 s acquireTimeout.
        assertWithin(performance.now() - closed, 0, watch, 'the end of the wait');
        watch.stop();
      } finally {
        await held.release();
        await app.close();
      }
      assert.ok(!ran.includes(sku), 'the handler ran for a caller that was gone');
    });
  });

  describe('on microservice handlers', () => {
    /** An app serving `RawMessages` over TCP, and a client of it. */
    async function startMessages() {
      const module = await Test.createTestingModule({
        imports: [RedisLockModule.forRoot({ connection: server.url, isGlobal: true })],
        controllers: [RawMessages],
      }).compile();
      const app = module.createNestApplication();
      const port = await freePort();
      app.connectMicroservice({ transport: Transport.TCP, options: { host: '127.0.0.1', port } });
      await app.startAllMicroservices();
      await app.init();
      const client = ClientProxyFactory.create({
        transport: Transport.TCP,
        options: { host: '127.0.0.1', port },
      });
      return { app, client };
    }

    it('a handler without parameter decorators gets (data, context) and answers a timeout with an RpcException', async () => {
      const { app, client } = await startMessages();
      try {
        const sku = uniqueKey();
        assert.deepEqual(await firstValueFrom(client.send('reserve-raw', { sku })), [sku, true]);
        const held = await app.get(LockService).acquire(`rpc:${sku}`, { ttl: 5_000 });
        try {
          const error = await firstValueFrom(client.send('reserve-raw', { sku })).catch(
            (e: unknown) => e,
          );
          assert.equal((error as { code?: string }).code, 'LOCK_TIMEOUT', JSON.stringify(error));
          assert.doesNotMatch(JSON.stringify(error), new RegExp(sku));
        } finally {
          await held.release();
        }
      } finally {
        await client.close();
        await app.close();
      }
    });

    it('a wait ends when the client closes its connection: the handler never runs', async () => {
      const { app, client } = await startMessages();
      const sku = uniqueKey();
      const held = await app.get(LockService).acquire(`rpc:${sku}`, { ttl: 10_000 });
      try {
        const reply = firstValueFrom(client.send('reserve-patient', { sku })).catch(() => 'gone');
        assert.ok(await eventually(() => hasWaiters(app, `rpc:${sku}`)), 'it waits');
        const watch = watchStalls();
        const closed = performance.now();
        await client.close();
        assert.equal(await reply, 'gone');
        assert.ok(await eventually(() => !hasWaiters(app, `rpc:${sku}`), 10_000), 'the wait ends');
        // With the connection, not at its 5 s acquireTimeout.
        assertWithin(performance.now() - closed, 0, watch, 'the end of the wait');
        watch.stop();
      } finally {
        await held.release();
        await app.close();
      }
      assert.ok(!ran.includes(sku), 'the handler ran for a caller that was gone');
    });
  });

  describe('maxWaiters', () => {
    it('a request beyond the waiters allowed per key answers 409 with Retry-After at once, and the waiting ones go on', async () => {
      const app = await bootApp(server, { maxWaiters: { perKey: 2 } });
      const url = await appUrl(app);
      const locks = app.get(LockService);
      const id = Math.floor(Math.random() * 1e9);
      const held = await locks.acquire(`order:${id}`, { ttl: 5_000 });
      try {
        // `patient` waits up to 5 s for order:{0}.
        const waiting = [1, 2].map(() => fetch(`${url}/orders/patient/${id}`));
        assert.ok(await eventually(() => waitingCallers(locks, `order:${id}`) === 2), 'they wait');
        const watch = watchStalls();
        const started = performance.now();
        const refused = await fetch(`${url}/orders/patient/${id}`);
        const took = performance.now() - started;
        assert.equal(refused.status, 409);
        // Nothing known of the key's holds, and the refusal asked Redis nothing: 1 s, not the
        // route's 5 s acquireTimeout.
        assert.equal(refused.headers.get('retry-after'), '1');
        // At once, not after the route's 5 s acquireTimeout.
        assertWithin(took, 0, watch, 'the refused request');
        watch.stop();
        await held.release();
        assert.deepEqual(
          (await Promise.all(waiting)).map((response) => response.status),
          [200, 200],
        );
      } finally {
        await held.release();
        await app.close();
      }
    });
  });

  describe('module-level timeoutStatus', () => {
    it('applies to every @WithLock handler that sets none of its own', async () => {
      const app = await bootApp(server, { timeoutStatus: 503 });
      try {
        const id = uniqueKey();
        const held = await app.get(LockService).acquire(`order:${id}`);
        const url = await appUrl(app);
        assert.equal(
          (await fetch(`${url}/orders/below/${id}`)).status,
          400,
          'pipes still run first',
        );
        const numeric = String(Math.floor(Math.random() * 1e9));
        const numericHeld = await app.get(LockService).acquire(`order:${numeric}`);
        assert.equal((await fetch(`${url}/orders/below/${numeric}`)).status, 503);
        assert.equal((await fetch(`${url}/orders/locked/${id}`)).status, 423, 'the decorator wins');
        await held.release();
        await numericHeld.release();
      } finally {
        await app.close();
      }
    });

    it('module-level timeoutException builds the error instead', async () => {
      const app = await bootApp(server, { timeoutException: () => new HttpException('busy', 429) });
      try {
        const numeric = String(Math.floor(Math.random() * 1e9));
        const held = await app.get(LockService).acquire(`order:${numeric}`);
        assert.equal((await fetch(`${await appUrl(app)}/orders/below/${numeric}`)).status, 429);
        await held.release();
      } finally {
        await app.close();
      }
    });

    it("the answer goes through the app's global exception filters", async () => {
      const seen: unknown[] = [];
      @Catch()
      class RecordingFilter implements ExceptionFilter {
        catch(exception: unknown, host: ArgumentsHost): void {
          seen.push(exception);
          const status = exception instanceof HttpException ? exception.getStatus() : 500;
          host
            .switchToHttp()
            .getResponse<{ status(code: number): { json(body: unknown): void } }>()
            .status(status)
            .json({ filtered: status });
        }
      }
      const module = await Test.createTestingModule({
        imports: [
          RedisLockModule.forRoot({ connection: server.url, isGlobal: true }),
          OrdersModule,
        ],
      }).compile();
      const app = module.createNestApplication();
      app.useGlobalFilters(new RecordingFilter());
      await app.listen(0, '127.0.0.1');
      try {
        const id = uniqueKey();
        const held = await app.get(LockService).acquire(`order:${id}`, { ttl: 5_000 });
        const response = await fetch(`${await appUrl(app)}/orders/locked/${id}`);
        await held.release();
        assert.equal(response.status, 423);
        assert.deepEqual(await response.json(), { filtered: 423 });
        assert.equal(seen.length, 1);
        assert.ok(seen[0] instanceof HttpException);
        assert.ok(seen[0].cause instanceof LockAcquireTimeoutError);
      } finally {
        await app.close();
      }
    });
  });

  describe('on provider methods called from code', () => {
    let app: INestApplication;
    let accounts: AccountsService;
    let locks: LockService;

    before(async () => {
      app = await bootApp(server);
      accounts = app.get(AccountsService);
      locks = app.get(LockService);
    });
    after(async () => {
      await app?.close();
    });

    it('locks on the key built from the arguments, and exposes the lock to the method', async () => {
      const id = uniqueKey();
      const pending = accounts.debit({ id }, 10);
      await sleep(5);
      assert.equal(await locks.isLocked(`acct:${id}`), true);
      const result = await pending;
      assert.ok(result.fence! > 0);
      assert.equal(await locks.isLocked(`acct:${id}`), false);
      assert.equal(await accounts.invoice('acme', 7), 'acme/invoice/7|acme/7');
    });

    it('the short form @WithLock(key, ttl, acquireTimeout) locks like the options object', async () => {
      const name = uniqueKey();
      const result = await accounts.short(name);
      assert.equal(result.key, `short:${name}`);
      assert.ok(result.ttl > 5_000 && result.ttl <= 7_000, `ttl ${result.ttl}`);
      assert.equal(await accounts.shortKeyOnly(name), `short-fn:${name}`);
      const held = await locks.acquire(`short:${name}`);
      const watch = watchStalls();
      const started = performance.now();
      await assert.rejects(accounts.short(name), LockAcquireTimeoutError);
      const waited = performance.now() - started;
      assert.ok(waited >= 140, `waited ${waited.toFixed(0)} ms for a 150 ms acquireTimeout`);
      assertWithin(waited, 150, watch, 'the wait with a 150 ms acquireTimeout');
      watch.stop();
      await held.release();
    });

    it('concurrent calls on one key run one at a time; a timeout throws LockAcquireTimeoutError', async () => {
      const id = uniqueKey();
      const results = await Promise.allSettled([
        accounts.debit({ id }, 1),
        accounts.debit({ id }, 2),
      ]);
      assert.equal(results.filter((r) => r.status === 'fulfilled').length, 2);
      const held = await locks.acquire(`acct:${id}`);
      await assert.rejects(accounts.debit({ id }, 3), LockAcquireTimeoutError);
      await held.release();
    });

    for (const [label, account] of [
      ['undefined', {}],
      ['null', { id: null }],
      ['an object', { id: { nested: true } }],
      ['an empty string', { id: '' }],
    ] as const) {
      it(`a placeholder resolving to ${label} throws LockKeyResolutionError naming it`, async () => {
        const error = await accounts.debit(account, 1).catch((e: unknown) => e);
        assert.ok(error instanceof LockKeyResolutionError, String(error));
        assert.equal(error.placeholder, '{0.id}');
        assert.equal(error.template, 'acct:{0.id}');
      });
    }

    it('a key list locks every key: calls naming the accounts in either order run one at a time, no deadlock', async () => {
      const [a, b] = [uniqueKey(), uniqueKey()];
      const results = await Promise.all(
        Array.from({ length: 10 }, (_, i) =>
          accounts.transfer(i % 2 === 0 ? { from: a, to: b } : { from: b, to: a }),
        ),
      );
      assert.equal(transferOverlaps, 0);
      const sorted = [`acct:${a}`, `acct:${b}`].sort();
      for (const result of results) assert.deepEqual(result.keys, sorted);
      const fences = results.map((result) => result.fences[sorted[1]]).sort((x, y) => x - y);
      assert.equal(new Set(fences).size, 10, 'every call got its own fence for each key');
      assert.equal(await locks.isLocked(`acct:${a}`), false);
      assert.equal(await locks.isLocked(`acct:${b}`), false);

      // One account busy: the call times out and leaves the other account free.
      const held = await locks.acquire(`acct:${b}`);
      await assert.rejects(
        accounts.transfer({ from: a, to: b }),
        (error: unknown) => error instanceof LockAcquireTimeoutError && error.key === `acct:${b}`,
      );
      assert.equal(await locks.isLocked(`acct:${a}`), false);
      await held.release();

      // A placeholder of either key that resolves to nothing locks neither.
      const error = await accounts.transfer({ from: a }).catch((e: unknown) => e);
      assert.ok(error instanceof LockKeyResolutionError, String(error));
      assert.equal(error.template, 'acct:{0.to}');
      assert.equal(await locks.isLocked(`acct:${a}`), false);

      const [x, y] = [uniqueKey(), uniqueKey()];
      assert.deepEqual(await accounts.pairShort(x, y), [`pair:${x}`, `pair:${y}`].sort());
    });

    it('the method error passes through unchanged and the lock is released', async () => {
      const name = uniqueKey();
      const error = await accounts.failing(name).catch((e: unknown) => e);
      assert.ok(error instanceof TypeError);
      assert.equal(error.message, 'domain failure');
      assert.equal(await locks.isLocked(`bad:${name}`), false);
    });

    it('an Observable method takes the lock on subscribe, holds it until complete, not before', async () => {
      const name = uniqueKey();
      const feed = accounts.feed(name);
      await sleep(50);
      assert.equal(await locks.isLocked(`feed:${name}`), false, 'not subscribed: no lock');
      const values: number[] = [];
      const done = new Promise<void>((resolve, reject) =>
        feed.subscribe({ next: (v) => values.push(v), error: reject, complete: resolve }),
      );
      assert.ok(await eventually(() => locks.isLocked(`feed:${name}`), 500));
      await done;
      assert.deepEqual(values, [1, 2, 3]);
      assert.ok(await eventually(async () => !(await locks.isLocked(`feed:${name}`)), 500));
    });

    it('an Observable method that errors passes the error on and releases its lock', async () => {
      const name = uniqueKey();
      const error = await new Promise((resolve) =>
        accounts.brokenFeed(name).subscribe({ error: resolve }),
      );
      assert.ok(error instanceof RangeError);
      assert.ok(await eventually(async () => !(await locks.isLocked(`broken-feed:${name}`)), 500));
    });

    it('auto-extends by default: a method running for three TTLs keeps its lock', async () => {
      const name = uniqueKey();
      const running = accounts.slow(name);
      await sleep(700);
      assert.equal(await locks.isLocked(`slow:${name}`), true, 'still held after two TTLs');
      assert.equal(await running, false, 'its signal never aborted');
      assert.equal(await locks.isLocked(`slow:${name}`), false);
    });

    it('unsubscribing from an Observable method releases its lock', async () => {
      const name = uniqueKey();
      const subscription = accounts.feed(name).subscribe();
      assert.ok(await eventually(() => locks.isLocked(`feed:${name}`), 500));
      subscription.unsubscribe();
      assert.ok(await eventually(async () => !(await locks.isLocked(`feed:${name}`)), 500));
    });

    it('an Observable returned without being declared is refused on the first call, lock released', async () => {
      const streams = app.get(UndeclaredStreams);
      const name = uniqueKey();
      await assert.rejects(Promise.resolve(streams.stream(name)), RedisLockConfigurationError);
      await assert.rejects(streams.later(name), RedisLockConfigurationError);
      assert.equal(await locks.isLocked(`undeclared:${name}`), false);
    });

    it('an instance not created by Nest fails with a clear error', async () => {
      const stray = new AccountsService();
      await assert.rejects(stray.debit({ id: 'x' }, 1), RedisLockConfigurationError);
    });
  });

  it('two apps in one process each use their own LockService and Redis', async () => {
    const otherServer = await startRedis();
    const first = await bootApp(server);
    const second = await bootApp(otherServer);
    const monitors = await Promise.all([monitorRedis(server.port), monitorRedis(otherServer.port)]);
    try {
      const id = uniqueKey();
      await Promise.all([
        first.get(AccountsService).debit({ id: `${id}-first` }, 1),
        second.get(AccountsService).debit({ id: `${id}-second` }, 1),
      ]);
      await sleep(20);
      // Each acquisition ran its scripts on the Redis of its own app, and none on the other.
      const locked = (on: number, name: string): boolean =>
        monitors[on].commands.some(({ args }) => args.includes(`lock:{acct:${id}-${name}}`));
      assert.deepEqual(
        [locked(0, 'first'), locked(1, 'second'), locked(0, 'second'), locked(1, 'first')],
        [true, true, false, false],
      );
    } finally {
      monitors.forEach((monitor) => monitor.stop());
      await first.close();
      await second.close();
      await otherServer.stop();
    }
  });

  describe('a provider made by useFactory or given as useValue', () => {
    for (const [how, provider] of [
      ['useFactory', { provide: AccountsService, useFactory: () => new AccountsService() }],
      ['useValue', { provide: AccountsService, useValue: new AccountsService() }],
    ] as const) {
      it(`${how}: gets the app's LockService though Nest injects nothing into it`, async () => {
        const module = await Test.createTestingModule({
          imports: [RedisLockModule.forRoot({ connection: server.url })],
          providers: [provider],
        }).compile();
        await module.init();
        try {
          const result = await module.get(AccountsService).debit({ id: uniqueKey() }, 1);
          assert.ok(result.fence! > 0, 'ran under a lock');
        } finally {
          await module.close();
        }
      });
    }

    it('with several LockServices in the app, which one is unknown: the app fails to boot', async () => {
      @Module({ imports: [RedisLockModule.forRoot({ connection: server.url })] })
      class First {}
      @Module({ imports: [RedisLockModule.forRoot({ connection: server.url })] })
      class Second {}
      const module = await Test.createTestingModule({
        imports: [First, Second],
        providers: [{ provide: AccountsService, useFactory: () => new AccountsService() }],
      }).compile();
      await assert.rejects(
        module.init(),
        (error) => error instanceof RedisLockConfigurationError && /useFactory/.test(error.message),
      );
      await module.close().catch(() => {});
    });
  });

  it('without LockService in the module, the app fails to boot', async () => {
    await assert.rejects(Test.createTestingModule({ imports: [OrdersModule] }).compile());
  });

  describe('bad options fail when the decorator is applied', () => {
    const cases: [string, WithLockOptions, string][] = [
      ['an empty key', { key: '' }, 'key'],
      ['a key that is not a string or function', { key: 42 as never }, 'key'],
      ['an unclosed brace', { key: 'order:{0' }, 'key'],
      ['a stray closing brace', { key: 'order:0}' }, 'key'],
      ['a placeholder that is not a position', { key: 'order:{id}' }, 'key'],
      ['an empty placeholder', { key: 'order:{}' }, 'key'],
      ['a negative ttl', { key: 'k', ttl: -1 }, 'ttl'],
      ['a NaN acquireTimeout', { key: 'k', acquireTimeout: Number.NaN }, 'acquireTimeout'],
      ['a string autoExtend', { key: 'k', autoExtend: 'yes' as never }, 'autoExtend'],
      ['a status outside 400-599', { key: 'k', timeoutStatus: 200 }, 'timeoutStatus'],
      [
        'both timeoutStatus and timeoutException',
        { key: 'k', timeoutStatus: 423, timeoutException: () => new Error() },
        'timeoutStatus + ',
      ],
      ['an unknown option', { key: 'k', timeout: 5 } as never, 'timeout'],
      ['an empty key list', { key: [] }, 'key'],
      ['a bad template in a key list', { key: ['a:{0}', 'b:{0'] }, 'key'],
    ];
    for (const [name, options, option] of cases) {
      it(`${name} → RedisLockConfigurationError naming ${option}`, () => {
        const descriptor: PropertyDescriptor = { value: async () => 1 };
        let thrown: unknown;
        try {
          WithLock(options)(class Billing {}.prototype, 'charge', descriptor);
        } catch (error) {
          thrown = error;
        }
        assert.ok(thrown instanceof RedisLockConfigurationError, String(thrown));
        assert.ok(thrown.option.startsWith(`@WithLock(Billing.charge).${option}`), thrown.option);
      });
    }

    const shortCases: [string, () => MethodDecorator, string][] = [
      ['a short-form empty key', () => WithLock(''), 'key'],
      ['a short-form zero ttl', () => WithLock('k', 0), 'ttl'],
      ['a short-form negative acquireTimeout', () => WithLock('k', 1_000, -5), 'acquireTimeout'],
      ['a short-form template error', () => WithLock('k:{0'), 'key'],
      [
        'a fourth short-form argument',
        () => (WithLock as never as (...a: unknown[]) => MethodDecorator)('k', 1, 2, 3),
        '',
      ],
      [
        'durations after an options object',
        () => (WithLock as never as (...a: unknown[]) => MethodDecorator)({ key: 'k' }, 1_000),
        '',
      ],
    ];
    for (const [name, decorate, option] of shortCases) {
      it(`${name} → RedisLockConfigurationError naming ${option || 'the decorator'}`, () => {
        const descriptor: PropertyDescriptor = { value: async () => 1 };
        let thrown: unknown;
        try {
          decorate()(class Billing {}.prototype, 'charge', descriptor);
        } catch (error) {
          thrown = error;
        }
        assert.ok(thrown instanceof RedisLockConfigurationError, String(thrown));
        const expected = option
          ? `@WithLock(Billing.charge).${option}`
          : '@WithLock(Billing.charge)';
        assert.ok(thrown.option.startsWith(expected), thrown.option);
      });
    }

    it('the overloads are type-checked: a short form with a string ttl does not compile, and throws', () => {
      assert.throws(
        // @ts-expect-error a ttl is a number of milliseconds
        () => WithLock('k', '1000')(class Billing {}.prototype, 'charge', { value: async () => 1 }),
        RedisLockConfigurationError,
      );
    });

    it('a synchronous method is refused (a lock would make it asynchronous behind its back)', () => {
      assert.throws(() => {
        class Ledger {
          @WithLock({ key: 'k' })
          total(): number {
            return 1;
          }
        }
        return Ledger;
      }, RedisLockConfigurationError);
    });
  });
});
