import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import type { INestApplication } from '@nestjs/common';
import { FastifyAdapter } from '@nestjs/platform-fastify';
import { ClientProxyFactory, Transport, type ClientProxy } from '@nestjs/microservices';
import { Test } from '@nestjs/testing';
import { Redis } from 'ioredis';
import { firstValueFrom } from 'rxjs';
import { LockAcquireTimeoutError, LockService } from '../../lib/index.js';
import { ACQUIRE_SCRIPT } from '../../lib/redis/lock.scripts.js';
import { AppModule } from '../../sample/app.module.js';
import { InventoryService } from '../../sample/inventory/inventory.service.js';
import { StockReportJob } from '../../sample/jobs/stock-report.job.js';
import { SampleConfig } from '../../sample/sample.config.js';
import { eventually, sleep, uniqueKey } from '../support/lock-module.js';
import { assertWithin, watchStalls } from '../support/timing.js';
import { monitorRedis, scriptCalls } from '../support/redis-monitor.js';
import { freePort, startRedis, type RedisServer } from '../support/redis-server.js';

const PAYMENT_DELAY = 150;
const ADAPTERS: Record<'Express' | 'Fastify', () => FastifyAdapter | undefined> = {
  Express: () => undefined,
  Fastify: () => new FastifyAdapter(),
};

/**
 * The sample app end to end on one HTTP platform: booted as `nest start` would boot it, against a
 * private Redis, driven over HTTP, SSE and its TCP microservice. One spec file per platform
 * (sample.express.e2e.spec.ts, sample.fastify.e2e.spec.ts), so the two run side by side.
 */
export function sampleAppSuite(adapterName: keyof typeof ADAPTERS): void {
  const createAdapter = ADAPTERS[adapterName];
  describe(`sample app on ${adapterName}`, () => {
    let server: RedisServer;
    let redis: Redis;
    let app: INestApplication;
    let url: string;
    let locks: LockService;
    let inventory: InventoryService;
    let rpc: ClientProxy;

    before(async () => {
      server = await startRedis();
      redis = new Redis(server.port, server.host);
      const microservicePort = await freePort();
      const module = await Test.createTestingModule({ imports: [AppModule] })
        .overrideProvider(SampleConfig)
        .useValue(
          new SampleConfig({
            redisUrl: server.url,
            reports: false,
            monitorInterval: 100,
            paymentDelay: PAYMENT_DELAY,
            microservicePort,
          }),
        )
        .compile();
      const adapter = createAdapter();
      app = adapter ? module.createNestApplication(adapter) : module.createNestApplication();
      app.connectMicroservice({
        transport: Transport.TCP,
        options: { host: '127.0.0.1', port: microservicePort },
      });
      await app.startAllMicroservices();
      await app.listen(0, '127.0.0.1');
      url = (await app.getUrl()).replace('[::1]', '127.0.0.1');
      locks = app.get(LockService);
      inventory = app.get(InventoryService);
      rpc = ClientProxyFactory.create({
        transport: Transport.TCP,
        options: { host: '127.0.0.1', port: microservicePort },
      });
    });
    after(async () => {
      await rpc?.close();
      await app?.close();
      redis?.disconnect();
      await server?.stop();
    });

    const post = (path: string, body: unknown = { quantity: 1 }): Promise<Response> =>
      fetch(`${url}${path}`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify(body),
      });

    async function stockOf(sku: string): Promise<number> {
      return Number(await redis.get(`sample:stock:${sku}`));
    }

    async function buyConcurrently(sku: string, route: string, buyers: number): Promise<number[]> {
      return Promise.all(
        Array.from(
          { length: buyers },
          async () => (await post(`/products/${sku}/${route}`)).status,
        ),
      );
    }

    it('N parallel purchases of stock S sell exactly S and never go negative', async () => {
      const sku = uniqueKey('last-items');
      await inventory.setStock(sku, 5);
      const statuses = await buyConcurrently(sku, 'purchase', 20);
      assert.equal(statuses.filter((s) => s === 201).length, 5, `statuses: ${statuses.join(' ')}`);
      assert.ok(
        statuses.every((s) => s === 201 || s === 422),
        `statuses: ${statuses.join(' ')}`,
      );
      assert.equal(await stockOf(sku), 0);
    });

    it('one product, one lock, however the URL spells its SKU: 20 purchases in 4 spellings sell exactly the stock', async () => {
      const sku = uniqueKey('spelling');
      await inventory.setStock(sku, 5);
      const spellings = [
        sku,
        sku.toUpperCase(),
        `%20${sku}`,
        `${sku[0].toUpperCase()}${sku.slice(1)}%09`,
      ];
      const statuses = await Promise.all(
        Array.from(
          { length: 20 },
          async (_, i) => (await post(`/products/${spellings[i % 4]}/purchase`)).status,
        ),
      );
      assert.equal(statuses.filter((s) => s === 201).length, 5, `statuses: ${statuses.join(' ')}`);
      assert.equal(await stockOf(sku), 0);
    });

    it('a purchase whose client hung up stops waiting for the lock and never runs: 20 clients gone while they wait', async () => {
      const sku = uniqueKey('hangup');
      const key = `sku:${sku}`;
      await inventory.setStock(sku, 100);
      // Whether this process has callers waiting for the key (internal: issue 40's inspect() will say).
      const { backend } = (
        locks as unknown as {
          engine: { parts: { backend: { hasWaiters(key: string): boolean } } };
        }
      ).engine.parts;
      const held = await locks.acquire(key, { ttl: 10_000 });
      try {
        const controllers = Array.from({ length: 20 }, () => new AbortController());
        const requests = controllers.map(async (controller) =>
          fetch(`${url}/products/${sku}/purchase`, {
            method: 'POST',
            headers: { 'content-type': 'application/json' },
            body: JSON.stringify({ quantity: 1 }),
            signal: controller.signal,
          }).then(
            () => 'answered',
            () => 'gone',
          ),
        );
        assert.ok(await eventually(() => backend.hasWaiters(key)), 'the purchases wait');
        const watch = watchStalls();
        const gone = performance.now();
        for (const controller of controllers) controller.abort();
        assert.deepEqual(new Set(await Promise.all(requests)), new Set(['gone']));
        assert.ok(await eventually(() => !backend.hasWaiters(key), 10_000), 'the waits end');
        // With their clients, not at the route's 2 s acquireTimeout: the server has 20 closed
        // connections to notice and the test polls every 10 ms (a bound of 0 failed in CI at 109 ms
        // for a measured slack of 103), so a tenth of the deadline.
        assertWithin(performance.now() - gone, 200, watch, 'the end of the waits');
        watch.stop();
      } finally {
        await held.release();
      }
      assert.equal(await stockOf(sku), 100);
      assert.equal(await locks.isLocked(key), false);
      // The route still works for a client that stays.
      assert.equal((await post(`/products/${sku}/purchase`)).status, 201);
      assert.equal(await stockOf(sku), 99);
    });

    it('what is not a SKU is refused with 400 before any lock: separators, braces, other scripts, 65 characters', async () => {
      const sku = uniqueKey('refused');
      await inventory.setStock(sku, 5);
      for (const spelling of [`${sku}%3Arefund`, `${sku}%7Bx%7D`, `${sku}%C3%A9`, 'a'.repeat(65)]) {
        const response = await post(`/products/${spelling}/purchase`);
        assert.equal(response.status, 400, spelling);
        assert.match(await response.text(), /sku must be a SKU/);
      }
      assert.equal(await stockOf(sku), 5);
      assert.deepEqual(await redis.keys('sample:lock:*refused*'), []);
    });

    it('control: the same load on the unlocked route oversells', async () => {
      const sku = uniqueKey('last-items');
      await inventory.setStock(sku, 5);
      const statuses = await buyConcurrently(sku, 'purchase-unlocked', 20);
      assert.ok(
        statuses.filter((s) => s === 201).length > 5,
        `the race must show: ${statuses.join(' ')}`,
      );
    });

    it('purchases of different SKUs run in parallel, those of one SKU one after another', async () => {
      const timed = async (skus: string[]): Promise<number> => {
        for (const sku of skus) await inventory.setStock(sku, 10);
        const started = performance.now();
        const statuses = await Promise.all(
          skus.map(async (sku) => (await post(`/products/${sku}/purchase`)).status),
        );
        assert.deepEqual(
          statuses,
          skus.map(() => 201),
        );
        return performance.now() - started;
      };
      const different = await timed([
        uniqueKey('a'),
        uniqueKey('b'),
        uniqueKey('c'),
        uniqueKey('d'),
      ]);
      const same = uniqueKey('same');
      const oneKey = await timed([same, same, same, same]);
      assert.ok(
        oneKey >= 4 * PAYMENT_DELAY,
        `one SKU took ${oneKey.toFixed(0)} ms: purchases overlapped`,
      );
      // One after another they would take 4 × PAYMENT_DELAY at least.
      assert.ok(
        different < 4 * PAYMENT_DELAY,
        `four SKUs took ${different.toFixed(0)} ms: they did not overlap`,
      );
    });

    it('moves between two SKUs lock both, all or none: moves both ways and purchases interleave without deadlock or lost stock', async () => {
      const [a, b] = [uniqueKey('move'), uniqueKey('move')];
      await inventory.setStock(a, 10);
      await inventory.setStock(b, 10);
      const started = performance.now();
      const statuses = await Promise.all([
        post(`/products/${a}/move`, { to: b, quantity: 1 }),
        post(`/products/${b}/move`, { to: a, quantity: 1 }),
        post(`/products/${a}/purchase`),
        post(`/products/${a}/move`, { to: b, quantity: 1 }),
        post(`/products/${b}/move`, { to: a, quantity: 1 }),
        post(`/products/${a}/purchase`),
      ]).then((responses) => responses.map((response) => response.status));
      assert.deepEqual(statuses, [201, 201, 201, 201, 201, 201]);
      // One holder at a time on A: six sections of PAYMENT_DELAY each, one after another.
      assert.ok(performance.now() - started >= 6 * PAYMENT_DELAY - 20);
      assert.equal(await stockOf(a), 8);
      assert.equal(await stockOf(b), 10);

      const moved = (await (await post(`/products/${a}/move`, { to: b, quantity: 2 })).json()) as {
        remaining: Record<string, number>;
        fences: Record<string, number>;
      };
      assert.deepEqual(moved.remaining, { [a]: 6, [b]: 12 });
      assert.ok(moved.fences[`sku:${a}`] > 0 && moved.fences[`sku:${b}`] > 0);
      assert.equal((await post(`/products/${a}/move`, { to: a, quantity: 1 })).status, 400);
      assert.equal((await post(`/products/${a}/move`, { quantity: 1 })).status, 400);
      assert.equal((await post(`/products/${a}/move`, { to: b, quantity: 99 })).status, 422);
      assert.equal(await locks.isLocked(`sku:${a}`), false);
      assert.equal(await locks.isLocked(`sku:${b}`), false);
    });

    it('control: the same moves without the locks lose stock', async () => {
      const [a, b] = [uniqueKey('move'), uniqueKey('move')];
      await inventory.setStock(a, 10);
      await inventory.setStock(b, 10);
      await Promise.all(Array.from({ length: 4 }, () => inventory.moveStock(a, b, 1)));
      assert.notDeepEqual([await stockOf(a), await stockOf(b)], [6, 14], 'the race must show');
    });

    it('the CSV export runs at most two at a time across instances (a counting semaphore): a third answers 409', async () => {
      const sku = uniqueKey('export');
      await inventory.setStock(sku, 4);
      const free = await fetch(`${url}/products/export.csv`);
      assert.equal(free.status, 200);
      assert.match(await free.text(), new RegExp(`^${sku},4$`, 'm'));
      // Two exports running elsewhere (another instance holds both places).
      const running = await Promise.all(
        [1, 2].map(() => locks.acquire('export', { limit: 2, ttl: 10_000 })),
      );
      const busy = await fetch(`${url}/products/export.csv`);
      assert.equal(busy.status, 409);
      assert.ok(Number(busy.headers.get('retry-after')) >= 1);
      await running[0].release();
      assert.equal((await fetch(`${url}/products/export.csv`)).status, 200);
      await running[1].release();
    });

    it('answers 409 with Retry-After when the lock is not acquired within acquireTimeout', async () => {
      const sku = uniqueKey('busy');
      await inventory.setStock(sku, 10);
      const held = await locks.acquire(`sku:${sku}`, { ttl: 10_000 });
      try {
        const started = performance.now();
        const response = await post(`/products/${sku}/purchase`);
        assert.equal(response.status, 409);
        const retryAfter = Number(response.headers.get('retry-after'));
        assert.ok(retryAfter >= 1 && retryAfter <= 10, `Retry-After: ${retryAfter}`);
        assert.equal(((await response.json()) as { statusCode: number }).statusCode, 409);
        assert.ok(performance.now() - started >= 2_000, 'waited the route acquireTimeout');
        assert.equal(await stockOf(sku), 10);
      } finally {
        await held.release();
      }
    });

    it('other exceptions pass through unchanged: 404, 400, 422', async () => {
      assert.equal((await post(`/products/${uniqueKey('unknown')}/purchase`)).status, 404);
      const sku = uniqueKey('bad-input');
      await inventory.setStock(sku, 1);
      assert.equal((await post(`/products/${sku}/purchase`, { quantity: 0 })).status, 400);
      assert.equal((await post(`/products/${sku}/purchase`, { quantity: 2 })).status, 422);
      assert.equal(await locks.isLocked(`sku:${sku}`), false);
    });

    it('a purchase takes the lock exactly once (the nested locked provider re-enters it)', async () => {
      const sku = uniqueKey('once');
      await inventory.setStock(sku, 3);
      const monitor = await monitorRedis(server.port);
      try {
        const response = await post(`/products/${sku}/purchase`);
        assert.equal(response.status, 201);
        const body = (await response.json()) as { fence: number };
        assert.ok(
          body.fence > 0,
          'the handler reached its fencing token through the async context',
        );
        await sleep(50);
        assert.equal(scriptCalls(monitor.commands, ACQUIRE_SCRIPT, `sample:lock:{sku:${sku}}`), 1);
      } finally {
        monitor.stop();
      }
    });

    it('the locked provider method excludes callers from code too', async () => {
      const sku = uniqueKey('from-code');
      await inventory.setStock(sku, 3);
      const results = await Promise.allSettled(
        Array.from({ length: 8 }, () => inventory.purchase(sku, 1)),
      );
      assert.equal(results.filter((r) => r.status === 'fulfilled').length, 3);
      assert.equal(await stockOf(sku), 0);
    });

    it('from code, a provider method whose lock stays taken throws LockAcquireTimeoutError', async () => {
      const sku = uniqueKey('held');
      await inventory.setStock(sku, 3);
      const held = await locks.acquire(`sku:${sku}`, { ttl: 10_000 });
      try {
        await assert.rejects(inventory.purchase(sku, 1), LockAcquireTimeoutError);
      } finally {
        await held.release();
      }
    });

    it('the SSE stocktake holds the lock until the stream completes', async () => {
      const sku = uniqueKey('stocktake');
      await inventory.setStock(sku, 4);
      const response = await fetch(`${url}/products/${sku}/stocktake`);
      assert.equal(response.status, 200);
      const reader = response.body!.getReader();
      // Up to the first event: the headers (and, on some adapters, a first empty chunk) may come
      // before the stream is subscribed and its lock taken.
      let text = '';
      while (!text.includes('data:')) {
        const chunk = await reader.read();
        assert.equal(chunk.done, false, 'the stream ended before its first event');
        text += new TextDecoder().decode(chunk.value);
      }
      assert.equal(await locks.isLocked(`sku:${sku}`), true, 'locked while streaming');
      const purchase = post(`/products/${sku}/purchase`); // waits for the stocktake to finish
      for (let chunk = await reader.read(); !chunk.done; chunk = await reader.read()) {
        text += new TextDecoder().decode(chunk.value);
      }
      assert.equal((text.match(/data:/g) ?? []).length >= 4, true);
      assert.equal((await purchase).status, 201);
      assert.ok(await eventually(async () => !(await locks.isLocked(`sku:${sku}`)), 1_000));
    });

    it('stocktakes of one SKU run side by side (read locks), a purchase waits for them', async () => {
      const sku = uniqueKey('stocktake');
      await inventory.setStock(sku, 4);
      const started = performance.now();
      const drain = async (): Promise<number> => {
        const response = await fetch(`${url}/products/${sku}/stocktake`);
        const reader = response.body!.getReader();
        while (!(await reader.read()).done);
        return performance.now() - started;
      };
      const both = Promise.all([drain(), drain()]);
      await sleep(100);
      const purchase = await post(`/products/${sku}/purchase`);
      const [first, second] = await both;
      assert.equal(purchase.status, 201);
      // Five steps of 200 ms each: together they take one stocktake's time; one after the other,
      // two (2 s at least).
      assert.ok(Math.max(first, second) < 2_000, `stocktakes took ${first} / ${second} ms`);
      assert.ok(performance.now() - started >= 1_000, 'the purchase waited for both');
    });

    it('the SSE stocktake releases the lock when the client disconnects', async () => {
      const sku = uniqueKey('gone');
      await inventory.setStock(sku, 4);
      const controller = new AbortController();
      const response = await fetch(`${url}/products/${sku}/stocktake`, {
        signal: controller.signal,
      });
      await response.body!.getReader().read();
      assert.equal(await locks.isLocked(`sku:${sku}`), true);
      controller.abort();
      assert.ok(
        await eventually(async () => !(await locks.isLocked(`sku:${sku}`)), 1_000),
        'released on disconnect',
      );
    });

    it("the stock report job runs once per turn across instances (@WithLock onBusy: 'skip', holdAtLeast)", async () => {
      const job = app.get(StockReportJob);
      const ran = await Promise.all([job.run(), job.run(), job.run()]);
      assert.deepEqual(
        ran.filter((r) => r),
        [true],
        `runs: ${ran.join(' ')}`,
      );
      const report = JSON.parse((await redis.get('sample:report:stock'))!) as {
        fence: number;
        report: object;
      };
      assert.ok(report.fence > 0);
      assert.ok(Object.keys(report.report).length > 0);
    });

    it('the low-stock monitor leads (@WhileLeader) and writes its alert with its term', async () => {
      const sku = uniqueKey('low');
      await inventory.setStock(sku, 1);
      const alert = async (): Promise<{ term: number; low: string[] } | undefined> => {
        const { term, alert: json } = await redis.hgetall('sample:alerts:low-stock');
        return json
          ? { term: Number(term), ...(JSON.parse(json) as { low: string[] }) }
          : undefined;
      };
      assert.ok(
        await eventually(async () => (await alert())?.low.includes(sku) === true, 5_000),
        'the leader reports the low SKU',
      );
      const { term } = (await alert())!;
      assert.ok(term > 0);
      assert.equal(await locks.isLocked('leader:low-stock'), true, 'the leader holds its key');
    });

    it('the TCP microservice handler locks too, and answers a timeout with an RpcException', async () => {
      const sku = uniqueKey('rpc');
      await inventory.setStock(sku, 2);
      const result = await firstValueFrom(rpc.send('inventory.purchase', { sku, quantity: 1 }));
      assert.equal(result.remaining, 1);
      const held = await locks.acquire(`sku:${sku}`, { ttl: 10_000 });
      try {
        const error = await firstValueFrom(
          rpc.send('inventory.purchase', { sku, quantity: 1 }),
        ).catch((e: unknown) => e);
        assert.equal((error as { code?: string }).code, 'LOCK_TIMEOUT', JSON.stringify(error));
      } finally {
        await held.release();
      }
      assert.equal(await stockOf(sku), 1);
    });

    it('one product, one lock across transports: 20 purchases over HTTP and TCP in 4 spellings sell exactly the stock', async () => {
      const sku = uniqueKey('across');
      await inventory.setStock(sku, 5);
      const spellings = [
        sku,
        sku.toUpperCase(),
        ` ${sku}`,
        `${sku[0].toUpperCase()}${sku.slice(1)}`,
      ];
      const outcomes = await Promise.all(
        Array.from({ length: 20 }, async (_, i) =>
          i % 2 === 0
            ? (await post(`/products/${encodeURIComponent(spellings[i % 4])}/purchase`)).status ===
              201
            : firstValueFrom(
                rpc.send('inventory.purchase', { sku: spellings[(i + 1) % 4], quantity: 1 }),
              ).then(
                () => true,
                () => false,
              ),
        ),
      );
      assert.equal(outcomes.filter(Boolean).length, 5);
      assert.equal(await stockOf(sku), 5 - 5);
    });

    it('bad input is refused before any lock, on every transport: a quantity that is not a whole number, a stock that is not one', async () => {
      const sku = uniqueKey('quantity');
      await inventory.setStock(sku, 5);
      for (const quantity of ['x', -100, 0.5, 0, '1']) {
        const error = await firstValueFrom(rpc.send('inventory.purchase', { sku, quantity })).catch(
          (e: unknown) => e,
        );
        assert.equal((error as { code?: string }).code, 'BAD_REQUEST', JSON.stringify(error));
      }
      for (const sku of [{ a: 1 }, '', 'a:b', 'x'.repeat(600)]) {
        const error = await firstValueFrom(
          rpc.send('inventory.purchase', { sku, quantity: 1 }),
        ).catch((e: unknown) => e);
        assert.equal((error as { code?: string }).code, 'BAD_REQUEST', JSON.stringify(error));
      }
      for (const body of [{ quantity: [1, 2] }, { quantity: { a: 1 } }, { quantity: -1 }, {}]) {
        const response = await fetch(`${url}/products/${sku}/stock`, {
          method: 'PUT',
          headers: { 'content-type': 'application/json' },
          body: JSON.stringify(body),
        });
        assert.equal(response.status, 400, JSON.stringify(body));
      }
      assert.equal(await stockOf(sku), 5);
    });
  });
}
