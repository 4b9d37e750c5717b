import assert from 'node:assert/strict';
import { spawn, type ChildProcess } from 'node:child_process';
import { once } from 'node:events';
import { after, before, describe, it } from 'node:test';
import { fileURLToPath } from 'node:url';
import { Redis } from 'ioredis';
import type { LockService } from '../../lib/index.js';
import {
  eventually,
  startLockModule,
  startNonPollingApp,
  uniqueKey,
  type LockModuleFixture,
} from '../support/lock-module.js';
import {
  countReadersWriters,
  countSemaphore,
  raceThenLock,
  transfersRaceThenLock,
} from '../support/processes.js';
import { startRedis, type RedisServer } from '../support/redis-server.js';
import { assertWithin, watchStalls } from '../support/timing.js';

const worker = fileURLToPath(new URL('../fixtures/lock-worker.js', import.meta.url));

describe('locks across processes', () => {
  let server: RedisServer;
  let redis: Redis;
  let fixture: LockModuleFixture;
  let locks: LockService;
  const children = new Set<ChildProcess>();

  before(async () => {
    server = await startRedis();
    redis = new Redis(server.port, '127.0.0.1');
    fixture = await startLockModule({ connection: server.url });
    locks = fixture.locks;
  });
  after(async () => {
    for (const child of children) child.kill('SIGKILL');
    await fixture?.close();
    redis?.disconnect();
    await server?.stop();
  });

  function run(...args: string[]): ChildProcess {
    const child = spawn(process.execPath, [worker, ...args], {
      stdio: ['ignore', 'pipe', 'inherit'],
    });
    children.add(child);
    child.once('exit', () => children.delete(child));
    return child;
  }

  const read = (counter: string): Promise<string | null> => redis.get(counter);

  it('4 processes incrementing under the lock end with the exact count (control: without it, they lose updates)', async () => {
    // One start of the processes: first the control, then under the lock. Enough control
    // iterations that the processes overlap (the start barrier lines them up).
    const { raced, locked } = await raceThenLock(String(server.port), 4, 300, 40, read);
    assert.ok(raced < 1_200, `expected lost updates in the control, got ${raced}`);
    assert.equal(locked, 160, `lost updates under the lock: ${locked} of 160`);
  });

  it('several keys: 4 processes, two naming them in the opposite order, end with exact counts and no deadlock (control without the lock loses updates)', async () => {
    const { raced, locked } = await transfersRaceThenLock(String(server.port), 4, 200, 40, read);
    assert.ok(
      raced.some((n) => n < 800),
      `the control lost no update: ${raced.join(', ')}`,
    );
    assert.deepEqual(
      locked,
      [160, 160],
      `lost updates under the lock: ${String(locked)} of [160, 160]`,
    );
  });

  it('4 processes incrementing under a fair lock end with the exact count (control: without it, they lose updates)', async () => {
    const target = String(server.port);
    const { raced, locked } = await raceThenLock(target, 4, 300, 25, read, 'fair');
    assert.ok(raced < 1_200, `the control lost no update: ${raced}`);
    assert.equal(locked, 100, `lost updates under the lock: ${locked} of 100`);
  });

  it('a counting semaphore across 4 processes, limit 2: never more than 2 inside, every entry counted (control: without it, more)', async () => {
    const target = String(server.port);
    const { raced, locked } = await countSemaphore(target, 4, 30, 30, 2, read);
    assert.ok(raced.peak > 2, `control peak ${raced.peak}`);
    assert.equal(locked.peak, 2, `overlap: ${locked.peak} holders at once, the limit is 2`);
    assert.equal(
      locked.entries,
      120,
      `lost updates under the lock: ${locked.entries} entries of 120`,
    );
  });

  it('read locks across processes (3 readers, 2 writers): no writer overlaps anyone, readers share, the writers’ count is exact (control: without the lock, violations)', async () => {
    const target = String(server.port);
    const { raced, locked } = await countReadersWriters(target, 3, 2, 60, 30, read);
    assert.ok(raced.violations > 0, JSON.stringify(raced));
    assert.equal(
      locked.violations,
      0,
      `overlap: ${locked.violations} times a writer beside another holder`,
    );
    assert.equal(locked.counter, 60, `lost updates under the lock: ${locked.counter} of 60`);
    assert.ok(locked.shared > 0, 'readers shared the key');
  });

  it('the lock of a SIGKILLed holder becomes free after its TTL, not before', async () => {
    const key = uniqueKey();
    const ttl = 1_500;
    const holder = run('hold', String(server.port), key, String(ttl));
    const [line] = (await once(holder.stdout!, 'data')) as [Buffer];
    const holderFence = Number(/HELD (\d+)/.exec(line.toString())![1]);
    await new Promise((resolve) => setTimeout(resolve, ttl)); // it keeps the lock alive past one TTL
    assert.equal(await locks.tryAcquire(key), null, 'a live holder keeps its lock');

    const watch = watchStalls();
    const killedAt = performance.now();
    holder.kill('SIGKILL');
    await once(holder, 'exit');
    assert.equal(await locks.tryAcquire(key), null, 'the dead holder’s lock outlives it');
    const lock = await locks.acquire(key, { acquireTimeout: ttl * 2 });
    const freedAfter = performance.now() - killedAt;
    // The holder extended every ttl/3, so at most the TTL was left when it died; the waiter
    // tries again when it runs out (its attempt's reply says when).
    assertWithin(freedAfter, ttl, watch, 'the wait for the killed holder’s lock');
    watch.stop();
    assert.ok(lock.fence > holderFence);
    await lock.release();
  });

  it('forceRelease() frees another process’s lock: our waiter gets it at once, the holder learns within a third of its TTL', async () => {
    const key = uniqueKey();
    const ttl = 3_000;
    const holder = run('hold', String(server.port), key, String(ttl));
    const [line] = (await once(holder.stdout!, 'data')) as [Buffer];
    const holderFence = Number(/HELD (\d+)/.exec(line.toString())![1]);
    const told = new Promise<string>((resolve) => {
      holder.stdout!.on('data', (chunk: Buffer) => {
        const lost = /LOST (\S+)/.exec(chunk.toString());
        if (lost) resolve(lost[1]);
      });
    });
    // A waiter that would not poll within this test: only the force's announcement wakes it.
    const operator = await startNonPollingApp({ connection: server.url });
    const waiting = operator.locks.acquire(key, { acquireTimeout: 20_000 });
    waiting.catch(() => {}); // awaited below
    assert.ok(await eventually(async () => (await locks.inspect(key)).waiting === 1), 'queued');
    const watch = watchStalls();
    const forcedAt = performance.now();
    const freed = await operator.locks.forceRelease(key, { reason: 'test: holder hung' });
    assert.deepEqual([freed.mode, freed.holders], ['exclusive', 1]);
    assert.ok(freed.fence > holderFence, `the force's fence ${freed.fence} above ${holderFence}`);
    const lock = await waiting;
    // Well under its next poll (60 s) and its acquireTimeout: woken by the force. Not 100 ms: a
    // loaded run took 364 ms for such a wake-up on a Cluster (the slack measures this process only).
    assertWithin(performance.now() - forcedAt, 1_000, watch, 'the waiter woken by the force');
    assert.ok(lock.fence > freed.fence, `fence ${lock.fence} above the force's ${freed.fence}`);
    assert.equal(await told, 'not-held');
    // Its watchdog extends a third of the TTL after the last extension: at most then it learns.
    assertWithin(performance.now() - forcedAt, ttl / 3, watch, 'the freed holder told');
    watch.stop();
    await once(holder, 'exit');
    await lock.release();
    await operator.close();
  });
});
