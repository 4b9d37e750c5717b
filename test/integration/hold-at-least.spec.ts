import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { Injectable } from '@nestjs/common';
import {
  LockArgumentError,
  RedisLockConfigurationError,
  WithLock,
  type Lock,
} from '../../lib/index.js';
import { startLockModule, twoAppsOnOneRedis, uniqueKey } from '../support/lock-module.js';

let runs = 0;

@Injectable()
class Report {
  /** A job that is over in a moment, run by timers that fire a little apart on each instance. */
  @WithLock({ key: 'job:{0}', onBusy: 'skip', holdAtLeast: 1_000 })
  async run(_name: string): Promise<string> {
    runs++;
    return 'ran';
  }
}

@Injectable()
class TwoKeyJob {
  @WithLock({ key: ['{0}', '{1}'], onBusy: 'skip', holdAtLeast: 5_000 })
  async run(_a: string, _b: string): Promise<string> {
    return 'ran';
  }
}

/** `holdAtLeast`: the key stays taken that long after the grant, however soon it is released. */
describe('holdAtLeast', () => {
  const env = twoAppsOnOneRedis();

  it('a release before it is over leaves the key in Redis for the rest, taken for everyone', async () => {
    const key = uniqueKey();
    // Counted from before the call: the grant (and its 800 ms) can only come later, so the
    // bound below holds however the machine stalls.
    const grantedAt = performance.now();
    const lock = await env.locks.acquire(key, { ttl: 5_000, holdAtLeast: 800 });
    assert.equal(await lock.release(), true);
    const pttl = await env.redis.pttl(`lock:{${key}}`);
    assert.ok(pttl > 0 && pttl <= 800, `PTTL ${pttl} after an early release`);
    assert.equal(await env.other.locks.tryAcquire(key), null, 'another app took it');
    assert.equal(await env.locks.tryAcquire(key), null, 'this app took it again');
    // A waiter of the same app is not handed the key: it gets it when it expires.
    const next = await env.locks.acquire(key, { acquireTimeout: 5_000 });
    const waited = performance.now() - grantedAt;
    try {
      assert.ok(waited >= 790, `taken ${waited.toFixed(0)} ms after the grant, before 800`);
      assert.ok(next.fence > lock.fence);
    } finally {
      await next.release();
    }
    assert.equal(await env.redis.exists(`lock:{${key}}`), 0, 'released at once after it');
  });

  it('a release before it is over still takes its process out of the queue of waiting processes (found by the model suite)', async () => {
    const key = uniqueKey();
    const first = await env.locks.acquire(key, { ttl: 5_000, holdAtLeast: 100 });
    await first.release(); // the key stays 100 ms
    // Waits for it: its process joins the key's queue of waiting processes.
    const second = await env.locks.acquire(key, { ttl: 5_000, holdAtLeast: 100 });
    await second.release();
    assert.equal(await env.redis.exists(`lock:{${key}}:turns`), 0, 'the process stayed queued');
    assert.ok((await env.redis.pttl(`lock:{${key}}`)) > 0, 'the key is kept for holdAtLeast');
  });

  it('a release after it is over deletes the key as any release does', async () => {
    const key = uniqueKey();
    const lock = await env.locks.acquire(key, { ttl: 5_000, holdAtLeast: 50 });
    await new Promise((resolve) => setTimeout(resolve, 80));
    assert.equal(await lock.release(), true);
    assert.equal(await env.redis.exists(`lock:{${key}}`), 0);
  });

  it('keeps every key of several, each its own remaining time', async () => {
    const [a, b] = [uniqueKey('a'), uniqueKey('b')];
    const lock: Lock = await env.locks.acquire([a, b], { ttl: 5_000, holdAtLeast: 600 });
    await lock.release();
    for (const key of [a, b]) {
      const pttl = await env.redis.pttl(`lock:{${key}}`);
      assert.ok(pttl > 0 && pttl <= 600, `${key}: PTTL ${pttl}`);
    }
  });

  it('a call that got nothing keeps nothing: a partial acquisition of several keys is undone at once', async () => {
    const [a, b] = [uniqueKey('job-a'), uniqueKey('job-b')];
    const taken = await env.other.locks.acquire(b, { ttl: 10_000 });
    try {
      // `a` is taken first (the keys go in order), then `b` is found busy: `a` is given back.
      assert.equal(await env.locks.tryAcquire([a, b], { ttl: 10_000, holdAtLeast: 8_000 }), null);
      assert.equal(
        await env.redis.exists(`lock:{${a}}`),
        0,
        'the undo kept the key for holdAtLeast',
      );
      // The same through the decorator: a skipped fire blocks no other job.
      const app = await startLockModule({ connection: env.server.url }, [TwoKeyJob]);
      try {
        assert.equal(await app.module.get(TwoKeyJob).run(a, b), undefined, 'not skipped');
        assert.equal(await env.redis.exists(`lock:{${a}}`), 0, 'the skip kept the key');
        const alone = await env.other.locks.tryAcquire(a);
        assert.ok(alone, 'an unrelated job on the first key alone is blocked');
        await alone.release();
      } finally {
        await app.close();
      }
    } finally {
      await taken.release();
    }
  });

  it('@WithLock onBusy skip + holdAtLeast: a job run by two instances a moment apart runs once', async () => {
    const first = await startLockModule({ connection: env.server.url }, [Report]);
    const second = await startLockModule({ connection: env.server.url }, [Report]);
    try {
      runs = 0;
      const name = uniqueKey('fire');
      assert.equal(await first.module.get(Report).run(name), 'ran');
      // The other instance's timer fires after the job is over: the key is still taken.
      assert.equal(await second.module.get(Report).run(name), undefined);
      assert.equal(runs, 1);
    } finally {
      await first.close();
      await second.close();
    }
  });

  it('bad values and combinations are refused, naming the options', async () => {
    for (const [options, argument] of [
      [{ holdAtLeast: -1 }, 'holdAtLeast'],
      [{ holdAtLeast: 1.5 }, 'holdAtLeast'],
      [{ ttl: 1_000, holdAtLeast: 2_000 }, 'holdAtLeast'],
      [{ holdAtLeast: 100, limit: 3 }, 'holdAtLeast + limit'],
      [{ holdAtLeast: 100, mode: 'read' as const }, 'holdAtLeast + mode'],
      [{ holdAtLeast: 100, fair: true }, 'holdAtLeast + fair'],
    ] as const) {
      await assert.rejects(
        env.locks.acquire(uniqueKey(), options),
        (error) => error instanceof LockArgumentError && error.argument === argument,
        JSON.stringify(options),
      );
    }
    // A nested call cannot change the outer hold's.
    const key = uniqueKey();
    await env.locks.using(
      key,
      async () => {
        await assert.rejects(
          env.locks.using(key, async () => {}, { holdAtLeast: 300 }),
          (error) => error instanceof LockArgumentError && error.argument === 'holdAtLeast',
        );
        await env.locks.using(key, async () => {}, { holdAtLeast: 200 });
      },
      { holdAtLeast: 200 },
    );
    // On the decorator, when it is applied.
    class Target {
      async method(): Promise<void> {}
    }
    const descriptor = Object.getOwnPropertyDescriptor(Target.prototype, 'method')!;
    assert.throws(
      () =>
        WithLock({ key: 'k', ttl: 500, holdAtLeast: 600 })(Target.prototype, 'method', descriptor),
      (error) => error instanceof RedisLockConfigurationError && /holdAtLeast/.test(error.message),
    );
  });
});
