/**
 * The skewed-clock shim the chaos suite's `redlock-clocks` mode starts its nodes with: a
 * redis-server under it answers TIME off by the offset, and its keys expire at its rate.
 */
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import { Redis } from 'ioredis';
import { sleep } from '../support/lock-module.js';
import { startRedis, type RedisServer } from '../support/redis-server.js';
import { skewedClock } from '../support/skewed-clock.js';

describe('a redis-server with a skewed clock (test support)', () => {
  let server: RedisServer;
  let client: Redis;

  before(async () => {
    server = await startRedis([], await skewedClock({ offsetMs: 3_000, rate: 1.25 }));
    client = new Redis(server.port, server.host);
  });

  after(async () => {
    client.disconnect();
    await server.stop();
  });

  it('answers TIME ahead by the offset', async () => {
    const before = Date.now();
    const [seconds, micros] = await client.time();
    const after = Date.now();
    const server = Number(seconds) * 1_000 + Number(micros) / 1_000;
    // 3 s ahead, plus at most 25 % of the time since the server started reading its clock.
    assert.ok(server - after > 2_900, `${server - after} ms ahead`);
    assert.ok(server - before < 3_000 + 0.25 * 60_000, `${server - before} ms ahead`);
  });

  it('runs its key expiry 25 % fast', async () => {
    // Redis counts from the SET to the PTTL, both inside [start, end]: at least the sleep, at most
    // the whole interval, 1.25 × each. Redis reads its clock once per turn of its event loop (its
    // cached time), so the SET's may be a few ms older than `start`: CI counted 1,259 ms where
    // 1,003 had passed since `start` (and before, 1,260 of 1,003 from after the SET's reply),
    // ~4 ms of real time over 1.25 × elapsed; 10 ms of slack for it.
    const start = performance.now();
    await client.set('k', 'v', 'PX', 5_000);
    await sleep(1_000);
    const remaining = await client.pttl('k');
    const elapsed = performance.now() - start;
    const counted = 5_000 - remaining;
    assert.ok(counted >= 1.25 * 1_000 - 5, `counted ${counted} ms of ${elapsed.toFixed(0)}`);
    assert.ok(counted <= 1.25 * (elapsed + 10), `counted ${counted} ms of ${elapsed.toFixed(1)}`);
  });
});
