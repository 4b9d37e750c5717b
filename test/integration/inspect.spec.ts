/**
 * `LockService.inspect(key)`: what holds a lock now, for every shape on one Redis (the Cluster and
 * Redlock have theirs in cluster.spec and redlock.spec).
 */
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import type { Lock, LockInspection } from '../../lib/index.js';
import { eventually, twoAppsOnOneRedis, uniqueKey } from '../support/lock-module.js';

/** `inspection` without `ttlLeft`, which is asserted within bounds. */
function shape({ ttlLeft, ...rest }: LockInspection): Omit<LockInspection, 'ttlLeft'> {
  assert.ok(ttlLeft >= 0, `ttlLeft ${ttlLeft}`);
  return rest;
}

const FREE = { held: false, mode: null, holders: 0, fence: null, waiting: 0 };

describe('inspect(key)', () => {
  const env = twoAppsOnOneRedis();

  it('a free key: not held, nobody waits', async () => {
    assert.deepEqual(await env.locks.inspect(uniqueKey()), { ...FREE, ttlLeft: 0 });
  });

  it('a plain lock: held by one, its TTL left; its fence where Redis records it (your own token)', async () => {
    const key = uniqueKey();
    const lock = await env.locks.acquire(key, { ttl: 5_000 });
    const held = await env.locks.inspect(key);
    assert.deepEqual(shape(held), {
      held: true,
      mode: 'exclusive',
      holders: 1,
      fence: null,
      waiting: 0,
    });
    assert.ok(held.ttlLeft > 4_000 && held.ttlLeft <= 5_000, `ttlLeft ${held.ttlLeft}`);
    await lock.release();
    assert.deepEqual(await env.locks.inspect(key), { ...FREE, ttlLeft: 0 });

    const own = await env.locks.acquire(key, { ttl: 5_000, token: `job-${key}` });
    assert.equal((await env.other.locks.inspect(key)).fence, own.fence);
    await own.release();
  });

  it('waiting counts the processes queued for a plain lock, one per process however many of its callers wait', async () => {
    const key = uniqueKey();
    const lock = await env.locks.acquire(key, { ttl: 10_000 });
    const waits: Promise<Lock>[] = [];
    const wait = (locks: typeof env.locks): void => {
      const pending = locks.acquire(key, { acquireTimeout: 10_000 });
      pending.catch(() => {}); // each is released below
      waits.push(pending);
    };
    wait(env.other.locks);
    wait(env.other.locks);
    assert.ok(
      await eventually(async () => (await env.locks.inspect(key)).waiting === 1),
      'one process waits',
    );
    wait(env.locks); // a waiter of the holder's own process
    assert.ok(
      await eventually(async () => (await env.locks.inspect(key)).waiting === 2),
      `two processes wait: ${JSON.stringify(await env.locks.inspect(key))}`,
    );
    await lock.release();
    // Each releases as it gets the lock, whatever the order.
    await Promise.all(waits.map(async (pending) => (await pending).release()));
    assert.ok(
      await eventually(async () => (await env.locks.inspect(key)).waiting === 0),
      'the queue empties as they get the lock',
    );
  });

  it('a semaphore: the places taken, the longest lease left', async () => {
    const key = uniqueKey();
    const places = [
      await env.locks.acquire(key, { limit: 3, ttl: 2_000 }),
      await env.other.locks.acquire(key, { limit: 3, ttl: 6_000 }),
    ];
    const seen = await env.locks.inspect(key);
    assert.deepEqual(shape(seen), {
      held: true,
      mode: 'semaphore',
      holders: 2,
      fence: null,
      waiting: 0,
    });
    assert.ok(seen.ttlLeft > 5_000 && seen.ttlLeft <= 6_000, `ttlLeft ${seen.ttlLeft}`);
    for (const place of places) await place.release();
    assert.deepEqual(await env.locks.inspect(key), { ...FREE, ttlLeft: 0 });
  });

  it('read locks: the readers, and a writer waiting for them to leave', async () => {
    const key = uniqueKey();
    const readers = [
      await env.locks.acquire(key, { mode: 'read', ttl: 5_000 }),
      await env.other.locks.acquire(key, { mode: 'read', ttl: 5_000 }),
    ];
    assert.deepEqual(shape(await env.locks.inspect(key)), {
      held: true,
      mode: 'read',
      holders: 2,
      fence: null,
      waiting: 0,
    });
    const writer = env.other.locks.acquire(key, { mode: 'write', acquireTimeout: 10_000 });
    writer.catch(() => {}); // released below
    assert.ok(
      await eventually(async () => (await env.locks.inspect(key)).waiting === 1),
      'the writer waits',
    );
    for (const reader of readers) await reader.release();
    const written = await writer;
    assert.deepEqual(shape(await env.locks.inspect(key)), {
      held: true,
      mode: 'exclusive',
      holders: 1,
      fence: null,
      waiting: 0,
    });
    await written.release();
  });

  it('a fair lock: each waiter counts', async () => {
    const key = uniqueKey();
    const lock = await env.locks.acquire(key, { fair: true, ttl: 10_000 });
    const waits = [env.other.locks, env.other.locks, env.locks].map((locks) => {
      const pending = locks.acquire(key, { fair: true, acquireTimeout: 10_000 });
      pending.catch(() => {}); // released below
      return pending;
    });
    assert.ok(
      await eventually(async () => (await env.locks.inspect(key)).waiting === 3),
      `three wait: ${JSON.stringify(await env.locks.inspect(key))}`,
    );
    await lock.release();
    // Each releases as it gets the lock, whatever the order.
    await Promise.all(waits.map(async (pending) => (await pending).release()));
  });

  it('checks its key', async () => {
    await assert.rejects(env.locks.inspect(''), { name: 'LockArgumentError' });
  });
});
