/**
 * `npm run demo`: what the lock does, in a few seconds. Uses REDIS_URL, or starts a private
 * redis-server; boots the sample app; fires bursts of concurrent purchases at the unlocked and
 * the locked route; prints what happened and writes an SVG timeline of the critical sections
 * (build/demo-timeline.svg, out of the tracked files, or the path given with --svg: `--svg
 * test/demo/timeline.svg` redraws the README's picture; `--svg -` for none).
 */
import 'reflect-metadata';
import { writeFileSync } from 'node:fs';
import { parseArgs } from 'node:util';
import { NestFactory } from '@nestjs/core';
import { LockService, type LockEvent } from '../../lib/index.js';
import { startRedis, type RedisServer } from '../support/redis-server.js';
import { renderTimeline, type Burst, type Row } from './timeline.js';

const { values } = parseArgs({
  options: { svg: { type: 'string', default: 'build/demo-timeline.svg' } },
});
const PAYMENT_MS = 25;
const LOCK_WAIT_MS = 500;

let redis: RedisServer | undefined;
if (!process.env.REDIS_URL) {
  try {
    redis = await startRedis();
  } catch (error) {
    console.error(`demo: no REDIS_URL set, and ${(error as Error).message}`);
    process.exit(1);
  }
  console.log(`demo: no REDIS_URL set, started a private redis-server at ${redis.url}`);
}
Object.assign(process.env, {
  REDIS_URL: process.env.REDIS_URL ?? redis!.url,
  PAYMENT_DELAY: String(PAYMENT_MS),
  LOCK_WAIT: String(LOCK_WAIT_MS),
  REPORTS: 'off',
});
// After the environment is set: the sample's config reads it when the app is created.
const { AppModule } = await import('../../sample/app.module.js');
const app = await NestFactory.create(AppModule, { logger: false });
await app.listen(0, '127.0.0.1');
const base = (await app.getUrl()).replace('[::1]', '127.0.0.1');
const locks = app.get(LockService);
const t0 = performance.now();
const now = (): number => performance.now() - t0;

// The locked sections, from the lock's own events: paired by fence.
const events: (LockEvent & { at: number })[] = [];
const subscription = locks.events.subscribe((event) => events.push({ ...event, at: now() }));

async function setStock(sku: string, quantity: number): Promise<void> {
  await fetch(`${base}/products/${sku}/stock`, {
    method: 'PUT',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ quantity }),
  });
}

interface Outcome {
  status: number;
  start: number;
  end: number;
}

async function burst(sku: string, route: 'purchase' | 'purchase-unlocked', count: number) {
  return Promise.all(
    Array.from({ length: count }, async (): Promise<Outcome> => {
      const start = now();
      const response = await fetch(`${base}/products/${sku}/${route}`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ quantity: 1 }),
      });
      await response.arrayBuffer();
      return { status: response.status, start, end: now() };
    }),
  );
}

const tally = (outcomes: Outcome[], status: number): number =>
  outcomes.filter((outcome) => outcome.status === status).length;

/** Rows for a locked key: each holder's wait and section, and each caller that gave up. */
function lockedRows(sku: string): Row[] {
  const key = `sku:${sku}`;
  const mine = events.filter((event) => event.key === key);
  const rows: Row[] = [];
  for (const event of mine) {
    if (event.type === 'acquired') {
      const released = mine.find((e) => e.type === 'released' && e.fence === event.fence);
      rows.push({
        waitFrom: event.at - event.waitedMs,
        from: event.at,
        to: released?.at ?? event.at,
        kind: 'held',
        label: `fence ${event.fence}`,
      });
    } else if (event.type === 'timeout') {
      rows.push({
        waitFrom: event.at - event.waitedMs,
        from: event.at,
        to: event.at,
        kind: 'gave-up',
      });
    }
  }
  return rows.sort((a, b) => a.from - b.from);
}

const bursts: Burst[] = [];

// 1. Without the lock: 12 buyers, 3 items.
await setStock('demo-unlocked', 3);
const unlocked = await burst('demo-unlocked', 'purchase-unlocked', 12);
const soldUnlocked = tally(unlocked, 201);
bursts.push({
  title: `Without the lock: 12 buyers, 3 items → ${soldUnlocked} sold (${Math.max(0, soldUnlocked - 3)} oversold)`,
  rows: unlocked
    .sort((a, b) => a.start - b.start)
    .map((o) => ({ from: o.start, to: o.end, kind: o.status === 201 ? 'overlap' : 'refused' })),
});

// 2. With the lock: the same 12 buyers, 3 items.
await setStock('demo-locked', 3);
const locked = await burst('demo-locked', 'purchase', 12);
const soldLocked = tally(locked, 201);
bursts.push({
  title: `With @WithLock: 12 buyers, 3 items → ${soldLocked} sold, ${tally(locked, 422)} told "sold out"`,
  rows: lockedRows('demo-locked'),
});

// 3. With the lock, more buyers than acquireTimeout lets through: the rest get 409.
await setStock('demo-busy', 1_000);
const busy = await burst('demo-busy', 'purchase', 30);
bursts.push({
  title: `With @WithLock, 30 buyers at once, ${LOCK_WAIT_MS} ms acquireTimeout → ${tally(busy, 201)} served in turn, ${tally(busy, 409)} got 409`,
  rows: lockedRows('demo-busy'),
});

console.log(`
| burst | requests | 201 sold | 422 sold out | 409 busy | stock left | oversold |
| --- | --- | --- | --- | --- | --- | --- |
| unlocked route, 3 items | 12 | ${soldUnlocked} | ${tally(unlocked, 422)} | 0 | ${await stockOf('demo-unlocked')} | ${Math.max(0, soldUnlocked - 3)} |
| @WithLock route, 3 items | 12 | ${soldLocked} | ${tally(locked, 422)} | ${tally(locked, 409)} | ${await stockOf('demo-locked')} | ${Math.max(0, soldLocked - 3)} |
| @WithLock route, busy | 30 | ${tally(busy, 201)} | ${tally(busy, 422)} | ${tally(busy, 409)} | ${await stockOf('demo-busy')} | — |

Without the lock, buyers read the same stock at once and all "buy" it: the shop oversells.
With it, one purchase of a SKU runs at a time across every instance of the app; a release hands
the lock straight to the next waiter, and callers that wait longer than acquireTimeout get 409
with Retry-After instead of piling up.`);

if (values.svg !== '-') {
  writeFileSync(values.svg, renderTimeline(bursts));
  console.log(`\ntimeline written to ${values.svg}`);
}

async function stockOf(sku: string): Promise<number> {
  const response = await fetch(`${base}/products/${sku}`);
  return ((await response.json()) as { stock: number }).stock;
}

subscription.unsubscribe();
await app.close();
await redis?.stop();
