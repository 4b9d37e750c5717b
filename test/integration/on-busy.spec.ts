import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import { Controller, Get, Injectable, Param, type INestApplication } from '@nestjs/common';
import { Interval } from '@nestjs/schedule';
import { defer, Observable, of, throwError, toArray, firstValueFrom } from 'rxjs';
import {
  LockAcquireTimeoutError,
  LockBackendError,
  LockService,
  RedisLockConfigurationError,
  WithLock,
  type LockEvent,
} from '../../lib/index.js';
import { FaultProxy } from '../support/fault-proxy.js';
import {
  eventually,
  LogCapture,
  startHttpApp,
  startLockModule,
  uniqueKey,
  waitingCallers,
} from '../support/lock-module.js';
import { startRedis, type RedisServer } from '../support/redis-server.js';
import { assertWithin, watchStalls } from '../support/timing.js';

let runs = 0;

@Injectable()
class Jobs {
  @WithLock({ key: 'job:{0}', onBusy: 'skip' })
  async report(_name: string): Promise<string> {
    runs++;
    return 'done';
  }

  @WithLock({ key: 'feed:{0}', onBusy: 'skip' })
  feed(_name: string): Observable<number> {
    return defer(() => {
      runs++;
      return of(1, 2, 3);
    });
  }

  /** Its stream fails once it runs. */
  @WithLock({ key: 'failing-feed:{0}', onBusy: 'skip' })
  failingFeed(_name: string): Observable<number> {
    return defer(() => {
      runs++;
      return throwError(() => new Error('the stream failed'));
    });
  }

  /** Its own lock is free; a lock it takes inside times out. */
  @WithLock({ key: 'outer:{0}', onBusy: 'skip' })
  async inner(name: string, locks: LockService): Promise<void> {
    await locks.acquire(`inner:${name}`, { acquireTimeout: 20 });
  }
}

/** A scheduled job (the scheduler is not started here: the test calls it as a fire would). */
@Injectable()
class ScheduledJob {
  @Interval(3_600_000)
  @WithLock({ key: 'scheduled:{0}', onBusy: 'skip' })
  async fire(_name: string, fail = false): Promise<string> {
    runs++;
    if (fail) throw new Error('the job itself failed');
    return 'ran';
  }
}

@Injectable()
class ShortJob {
  @WithLock({ key: 'short:{0}', onBusy: 'skip', ttl: 250 })
  async run(_name: string): Promise<void> {
    runs++;
  }
}

/** A job that skips when busy but waits a while first. */
@Injectable()
class PatientJob {
  @WithLock({ key: 'patient:{0}', onBusy: 'skip', acquireTimeout: 10_000 })
  async run(_name: string): Promise<string> {
    runs++;
    return 'ran';
  }
}

@Controller('jobs')
class JobsController {
  @Get(':name')
  @WithLock({ key: 'job:{0}', onBusy: 'skip' })
  async run(@Param('name') name: string): Promise<{ ran: string }> {
    runs++;
    return { ran: name };
  }
}

/** `@WithLock({ onBusy: 'skip' })`: a job that another instance runs is skipped, not failed. */
describe("@WithLock onBusy: 'skip'", () => {
  let server: RedisServer;
  let app: INestApplication;
  let locks: LockService;
  let jobs: Jobs;
  let base: string;
  const logs = new LogCapture();

  before(async () => {
    server = await startRedis();
    // A long default wait: a skipping call must not use it.
    const options = { connection: server.url, defaults: { acquireTimeout: 60_000 } };
    let url: string;
    ({ app, locks, url } = await startHttpApp(
      options,
      { controllers: [JobsController], providers: [Jobs] },
      logs,
    ));
    base = `${url}/jobs`;
    jobs = app.get(Jobs);
  });

  after(async () => {
    await app?.close();
    await server?.stop();
  });

  /** Runs `fn` while another holder has `key`, failing if it waits for that holder. */
  async function whileHeld<T>(key: string, fn: () => Promise<T>): Promise<T> {
    const held = await locks.acquire(key, { ttl: 30_000 });
    try {
      const waited = new Promise<never>((_, reject) => {
        const timer = setTimeout(() => reject(new Error('the call waited for the holder')), 10_000);
        timer.unref();
      });
      return await Promise.race([fn(), waited]);
    } finally {
      await held.release();
    }
  }

  it('a busy key: the method is not run, the call resolves undefined at once, a skipped event (not a timeout) is emitted, nothing logged above debug', async () => {
    const name = uniqueKey('r');
    const events: LockEvent[] = [];
    const subscription = locks.events.subscribe((event) => events.push(event));
    try {
      runs = 0;
      const before = logs.lines.length;
      assert.equal(await whileHeld(`job:${name}`, () => jobs.report(name)), undefined);
      assert.equal(runs, 0);
      assert.deepEqual(
        events
          .filter(({ key, type }) => key === `job:${name}` && /^(skipped|timeout)$/.test(type))
          .map(({ type }) => type),
        ['skipped'],
      );
      const loud = logs.lines.slice(before).filter((line) => line.level !== 'debug');
      assert.deepEqual(loud, []);
      // Free: it runs.
      assert.equal(await jobs.report(name), 'done');
      assert.equal(runs, 1);
    } finally {
      subscription.unsubscribe();
    }
  });

  it('a call refused by maxWaiters while callers of its process wait for the key is skipped too: undefined at once, a skipped event, not a timeout', async () => {
    const patient = await startHttpApp(
      { connection: server.url, maxWaiters: { perKey: 1 } },
      { providers: [PatientJob] },
      new LogCapture(),
    );
    const name = uniqueKey('p');
    const key = `patient:${name}`;
    const events: LockEvent[] = [];
    const subscription = patient.locks.events.subscribe((event) => events.push(event));
    const held = await locks.acquire(key, { ttl: 30_000 });
    try {
      runs = 0;
      const job = patient.app.get(PatientJob);
      const waiting = job.run(name);
      waiting.catch(() => {}); // (ends with the app if an assertion fails)
      assert.ok(await eventually(() => waitingCallers(patient.locks, key) === 1), 'never waited');
      const watch = watchStalls();
      const started = performance.now();
      assert.equal(await job.run(name), undefined);
      // At once (no command sent), not after its 10 s acquireTimeout.
      assertWithin(performance.now() - started, 0, watch, 'the refusal');
      watch.stop();
      assert.equal(runs, 0);
      assert.deepEqual(
        events
          .filter((event) => event.key === key && /^(skipped|timeout)$/.test(event.type))
          .map(({ type }) => type),
        ['skipped'],
      );
      await held.release();
      assert.equal(await waiting, 'ran');
    } finally {
      subscription.unsubscribe();
      await held.release();
      await patient.app.close();
    }
  });

  it('an Observable method completes empty', async () => {
    const name = uniqueKey('f');
    runs = 0;
    const values = await whileHeld(`feed:${name}`, () =>
      firstValueFrom(jobs.feed(name).pipe(toArray())),
    );
    assert.deepEqual(values, []);
    assert.equal(runs, 0);
    assert.deepEqual(await firstValueFrom(jobs.feed(name).pipe(toArray())), [1, 2, 3]);
  });

  it('an Observable method whose stream fails once it ran is not skipped: the error passes on (found by mutation testing)', async () => {
    const name = uniqueKey('ff');
    runs = 0;
    await assert.rejects(
      firstValueFrom(jobs.failingFeed(name).pipe(toArray())),
      /the stream failed/,
    );
    assert.equal(runs, 1);
    assert.equal(await locks.isLocked(`failing-feed:${name}`), false);
  });

  it("on a route: Nest's empty 200, the handler not run", async () => {
    const name = uniqueKey('h');
    runs = 0;
    const response = await whileHeld(`job:${name}`, () => fetch(`${base}/${name}`));
    assert.equal(response.status, 200);
    assert.equal(await response.text(), '');
    assert.equal(runs, 0);
  });

  it('a lock timeout from inside the method is not a skip: it passes on', async () => {
    const name = uniqueKey('i');
    await assert.rejects(
      whileHeld(`inner:${name}`, () => jobs.inner(name, locks)),
      (error) => error instanceof LockAcquireTimeoutError && error.key === `inner:${name}`,
    );
  });

  it('a Redis that does not answer is not busy: LockBackendError, never a silent skip', async () => {
    const proxy = await FaultProxy.start(() => server.port);
    const slow = await startLockModule(
      { connection: `redis://127.0.0.1:${proxy.port}`, commandTimeout: 300 },
      [Jobs],
    );
    try {
      await slow.locks.isLocked(uniqueKey()); // a connection, before the partition
      proxy.stall();
      runs = 0;
      await assert.rejects(
        slow.module.get(Jobs).report(uniqueKey()),
        (error) => error instanceof LockBackendError,
      );
      assert.equal(runs, 0);
    } finally {
      proxy.heal();
      await slow.close();
      await proxy.close();
    }
  });

  it('a scheduled job whose lock cannot reach Redis: each fire resolves undefined, not run, and the outage is logged once, then its end once', async () => {
    const proxy = await FaultProxy.start(() => server.port);
    const slow = await startLockModule(
      { connection: `redis://127.0.0.1:${proxy.port}`, commandTimeout: 200 },
      [ScheduledJob],
    );
    const { capture, restore } = LogCapture.install();
    try {
      await slow.locks.isLocked(uniqueKey()); // a connection, before the partition
      const job = slow.module.get(ScheduledJob);
      const name = uniqueKey('s');
      proxy.stall();
      runs = 0;
      for (let fire = 0; fire < 4; fire++) assert.equal(await job.fire(name), undefined);
      assert.equal(runs, 0);
      const lines = (level: string): string[] =>
        capture.lines
          .filter((line) => line.level === level && line.message.includes('ScheduledJob.fire'))
          .map(({ message }) => message);
      assert.equal(lines('warn').length, 1, lines('warn').join('\n'));
      assert.match(
        lines('warn')[0],
        /The scheduled job ScheduledJob\.fire failed; its fires are not run while its lock cannot reach Redis .*Redis failed during acquire/,
      );
      assert.deepEqual(lines('error'), []);
      proxy.heal();
      // The first fire after Redis is back runs and throws: its lock worked, so the outage ends.
      assert.ok(
        await eventually(async () => {
          try {
            await job.fire(name, true);
            return false;
          } catch (error) {
            return (error as Error).message === 'the job itself failed';
          }
        }, 5_000),
        'runs once Redis is back, its own error passed on',
      );
      assert.equal(lines('log').length, 1);
      assert.match(
        lines('log')[0],
        /ScheduledJob\.fire works again after .* \(\d+ failed attempts\)/,
      );
      // A second outage is a new one: warned again (found by a review: it was silent).
      proxy.stall();
      assert.equal(await job.fire(name), undefined);
      assert.equal(lines('warn').length, 2);
      proxy.heal();
      assert.ok(await eventually(async () => (await job.fire(name)) === 'ran', 5_000));
    } finally {
      restore();
      proxy.heal();
      await slow.close();
      await proxy.close();
    }
  });

  it("a key held by this process's own abandoned attempt is not busy: a fire after Redis comes back runs (the restart case)", async () => {
    // As after a restart: attempts sent while Redis could not answer reach it when it is back, and
    // their grants are undone. A fire that lands between the grant and its undo is not skipped.
    const proxy = await FaultProxy.start(() => server.port);
    const slow = await startLockModule(
      { connection: `redis://127.0.0.1:${proxy.port}`, commandTimeout: 300 },
      [Jobs],
    );
    try {
      const job = slow.module.get(Jobs);
      await slow.locks.isLocked(uniqueKey()); // a connection, before the partition
      const name = uniqueKey('restart');
      proxy.stall();
      // The earlier fire: no answer within commandTimeout; its attempt waits in the pipe.
      await assert.rejects(job.report(name), (error) => error instanceof LockBackendError);
      runs = 0;
      proxy.heal();
      // The next fire is sent right behind it: Redis grants the stale attempt first.
      assert.equal(await job.report(name), 'done', 'skipped, though nobody else held the key');
      assert.equal(runs, 1);
      // And tryAcquire the same way.
      const other = uniqueKey('restart');
      proxy.stall();
      await assert.rejects(slow.locks.tryAcquire(`job:${other}`), LockBackendError);
      proxy.heal();
      const lock = await slow.locks.tryAcquire(`job:${other}`);
      assert.ok(lock, 'tryAcquire found its own abandoned grant busy');
      await lock.release();
    } finally {
      proxy.heal();
      await slow.close();
      await proxy.close();
    }
  });

  it('a lock nobody else held that came too late is not busy: LockAcquireTimeoutError (busy false), never a silent skip', async () => {
    const proxy = await FaultProxy.start(() => server.port);
    const slow = await startLockModule(
      { connection: `redis://127.0.0.1:${proxy.port}`, commandTimeout: 2_000 },
      [ShortJob],
    );
    try {
      await slow.locks.isLocked(uniqueKey()); // a connection, before the latency
      // A 300 ms round trip against a 250 ms TTL: every grant arrives after its lease.
      proxy.setLatency(150);
      runs = 0;
      await assert.rejects(
        slow.module.get(ShortJob).run(uniqueKey()),
        (error) => error instanceof LockAcquireTimeoutError && error.busy === false,
      );
      assert.equal(runs, 0);
    } finally {
      proxy.setLatency(0);
      await slow.close();
      await proxy.close();
    }
  });

  it("bad values, and 'skip' with a timeout answer, are refused when the decorator is applied", () => {
    const apply = (options: object): void => {
      class Target {
        async method(): Promise<void> {}
      }
      const descriptor = Object.getOwnPropertyDescriptor(Target.prototype, 'method')!;
      WithLock({ key: 'k', ...options })(Target.prototype, 'method', descriptor);
    };
    for (const options of [
      { onBusy: 'maybe' },
      { onBusy: 'skip', timeoutStatus: 423 },
      { onBusy: 'skip', timeoutException: () => new Error('x') },
    ]) {
      assert.throws(
        () => apply(options),
        (error) => error instanceof RedisLockConfigurationError && /onBusy/.test(error.message),
        JSON.stringify(options),
      );
    }
    apply({ onBusy: 'fail', timeoutStatus: 423 });
  });
});
