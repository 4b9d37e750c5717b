import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import { Injectable, Module, Scope } from '@nestjs/common';
import { Test } from '@nestjs/testing';
import { Redis } from 'ioredis';
import { hostname } from 'node:os';
import {
  getCurrentLock,
  LeaderElectionTimeoutError,
  LeadershipStoppedError,
  LockAcquireAbortedError,
  LockArgumentError,
  LockLostError,
  LockService,
  RedisLockModule,
  RedisLockConfigurationError,
  RedisLockShutdownError,
  WhileLeader,
  type LeaderTerm,
  type Leadership,
  type LockEvent,
} from '../../lib/index.js';
import { FaultProxy } from '../support/fault-proxy.js';
import {
  eventually,
  LogCapture,
  sleep,
  startLockModule,
  uniqueKey,
  type LockModuleFixture,
} from '../support/lock-module.js';
import { startRedis, type RedisServer } from '../support/redis-server.js';
import { assertWithin, watchStalls } from '../support/timing.js';
import { assertElectionReadable } from '../support/election.js';
import { monitorRedis, scriptCalls } from '../support/redis-monitor.js';
import { ACQUIRE_SCRIPT } from '../../lib/redis/lock.scripts.js';
import { RECORD_TERM_SCRIPT } from '../../lib/redis/election.scripts.js';

/** What a leader's work writes to: rejects a fence lower than the highest it has seen. */
class FencedStore {
  highest = 0;
  readonly accepted: number[] = [];
  write(fence: number): boolean {
    if (fence < this.highest) return false;
    this.highest = fence;
    this.accepted.push(fence);
    return true;
  }
}

/** A campaigner's record of its terms, and how many leaders run their work at once. */
class Terms {
  readonly fences: number[] = [];
  inside = 0;
  mostInside = 0;
  /** Work that leads until its term's signal aborts; `onTerm` runs first. */
  leadUntilAborted(onTerm: (term: LeaderTerm) => void = () => {}) {
    return async (term: LeaderTerm): Promise<void> => {
      this.fences.push(term.fence);
      this.inside++;
      this.mostInside = Math.max(this.mostInside, this.inside);
      try {
        onTerm(term);
        await new Promise((resolve) =>
          term.signal.addEventListener('abort', resolve, { once: true }),
        );
      } finally {
        this.inside--;
      }
    };
  }
}

/** `LockService.lead()` and `@WhileLeader`: fenced leader election. */
// A stop() or a term that never settles fails here within the bound, not at the gate's file timeout.
describe('leadership (lead, @WhileLeader)', { timeout: 90_000 }, () => {
  let server: RedisServer;
  let redis: Redis;
  const apps: LockModuleFixture[] = [];
  let logs: ReturnType<typeof LogCapture.install>;

  before(async () => {
    server = await startRedis();
    redis = new Redis(server.port, '127.0.0.1');
    for (let i = 0; i < 3; i++) {
      // A long TTL: a leader that follows another within the test was handed over, never timed out.
      apps.push(
        await startLockModule({
          connection: server.url,
          defaults: { ttl: 60_000, retryInterval: 100 },
        }),
      );
    }
    logs = LogCapture.install(); // after compile(): the testing module installs its own logger
  });
  after(async () => {
    for (const app of apps) await app.close();
    redis?.disconnect();
    await server?.stop();
    logs?.restore();
  });

  it('one leader at a time; stop() hands over at once; every term has a greater fence', async () => {
    const key = uniqueKey('leader');
    const terms = new Terms();
    const changes: boolean[][] = [[], [], []];
    const leaderships = apps.map(({ locks }, i) => {
      const leadership = locks.lead(key, terms.leadUntilAborted());
      leadership.changes.subscribe((leading) => changes[i].push(leading));
      return leadership;
    });
    const leader = (): Leadership | undefined => leaderships.find(({ isLeader }) => isLeader);
    const stopped = new Set<Leadership>();
    for (let round = 0; round < 3; round++) {
      // Each follower is woken by the previous leader's release: the TTL is 60 s.
      assert.ok(
        await eventually(() => leader() !== undefined, 20_000),
        `a leader in round ${round}`,
      );
      assert.equal(leaderships.filter(({ isLeader }) => isLeader).length, 1);
      const current = leader()!;
      await current.stop();
      assert.equal(current.isLeader, false);
      stopped.add(current);
    }
    assert.equal(stopped.size, 3, 'each campaigner led once, one after another');
    assert.equal(terms.mostInside, 1, 'never two leaders at once');
    assert.equal(terms.fences.length, 3);
    for (let i = 1; i < terms.fences.length; i++) {
      assert.ok(terms.fences[i] > terms.fences[i - 1], `terms ${terms.fences.join(', ')}`);
    }
    assert.deepEqual(changes, [
      [true, false],
      [true, false],
      [true, false],
    ]);
    assert.equal(await apps[0].locks.isLocked(key), false, 'the last stop() released the lock');
  });

  it('stop() from outside waits for the work to return; a work that throws once stopped is not logged as failed', async () => {
    const key = uniqueKey('leader');
    let returned = false;
    const leadership = apps[0].locks.lead(key, async ({ signal }) => {
      await new Promise((resolve) => signal.addEventListener('abort', resolve, { once: true }));
      await sleep(200); // winding down
      returned = true;
      throw new Error('interrupted by the stop');
    });
    assert.ok(await eventually(() => leadership.isLeader, 5_000));
    await leadership.stop();
    assert.equal(returned, true, 'stop() resolved before the work returned');
    const failed = logs.capture.lines.filter(
      ({ level, message }) => level === 'error' && message.includes(key),
    );
    assert.deepEqual(failed, [], 'a work that ended because it was stopped was logged as failed');
  });

  it("a term's record is written once as it begins (a long TTL: no renewal meanwhile), not while following nor as the leadership stops; no probe of Redis before an attempt while it answers (found by mutation testing)", async () => {
    const key = uniqueKey('leader');
    // Loaded: each record one EVALSHA, none sent twice through the NOSCRIPT detour.
    await redis.script('LOAD', RECORD_TERM_SCRIPT);
    const monitor = await monitorRedis(server.port);
    try {
      const leader = apps[0].locks.lead(key, new Terms().leadUntilAborted());
      assert.ok(await eventually(() => leader.isLeader));
      const follower = apps[1].locks.lead(key, new Terms().leadUntilAborted());
      const attempts = (): number => scriptCalls(monitor.commands, ACQUIRE_SCRIPT, `lock:{${key}}`);
      assert.ok(await eventually(() => attempts() >= 2), 'the follower never tried');
      await follower.stop();
      await leader.stop();
      await monitor.caughtUp();
      assert.equal(
        scriptCalls(monitor.commands, RECORD_TERM_SCRIPT, `lock:{${key}}`),
        1,
        "the term's records",
      );
      const probes = monitor.commands.filter(
        ({ source, args }) =>
          source !== 'lua' && args[0] === 'exists' && args[1] === `lock:{${key}}`,
      );
      assert.deepEqual(probes, [], 'probed Redis before an attempt');
    } finally {
      monitor.stop();
    }
  });

  it('a campaign started after onModuleDestroy ends as shutdown goes on, not after its pause between terms (found by mutation testing)', async () => {
    const app = await startLockModule({
      connection: server.url,
      defaults: { retryInterval: 5_000 }, // a campaign's pause between terms
    });
    try {
      await app.locks.onModuleDestroy(); // the leaderships stopped: lead() still allowed
      let terms = 0;
      const late = app.locks.lead(uniqueKey('leader'), () => void terms++);
      let ended = false;
      late.changes.subscribe({ complete: () => (ended = true) });
      assert.ok(await eventually(() => terms === 1), 'never led');
      await sleep(50); // its term over: in its pause
      const stalls = watchStalls();
      const started = performance.now();
      await app.locks.onApplicationShutdown();
      assert.ok(await eventually(() => ended, 6_000), 'the campaign never ended');
      assertWithin(performance.now() - started, 0, stalls, 'the late campaign');
      stalls.stop();
    } finally {
      await app.close();
    }
  });

  it('stop() of a follower waiting for its turn logs nothing: its wait ends, no outage (found by mutation testing)', async () => {
    const key = uniqueKey('leader');
    const monitor = await monitorRedis(server.port);
    const leader = apps[0].locks.lead(key, new Terms().leadUntilAborted());
    assert.ok(await eventually(() => leader.isLeader));
    const follower = apps[1].locks.lead(key, new Terms().leadUntilAborted());
    const from = logs.capture.lines.length;
    try {
      // The leader's grant, then the follower's attempt, refused: it waits.
      const attempts = (): number => scriptCalls(monitor.commands, ACQUIRE_SCRIPT, `lock:{${key}}`);
      assert.ok(await eventually(() => attempts() >= 2), 'the follower never tried');
      await follower.stop();
      const said = logs.capture.lines
        .slice(from)
        .filter(({ level, message }) => ['warn', 'error'].includes(level) && message.includes(key));
      assert.deepEqual(said, []);
    } finally {
      monitor.stop();
      await leader.stop();
    }
  });

  it('a term whose record for leader() cannot be written leads on and says so (found by mutation testing)', async () => {
    const key = uniqueKey('leader');
    // The record's key made a string: the script that writes the term's record fails (WRONGTYPE).
    await redis.set(`lock:{${key}}:leader`, 'not a record');
    const from = logs.capture.lines.length;
    const failed = (): string[] =>
      logs.capture.lines
        .slice(from)
        .filter(
          ({ level, message }) => level === 'warn' && message.includes('Could not record term'),
        )
        .map(({ message }) => message);
    const leadership = apps[0].locks.lead(key, new Terms().leadUntilAborted(), { ttl: 600 });
    try {
      const term = await leadership.elected({ timeout: 5_000 });
      assert.ok(await eventually(() => failed().length > 0), 'the failed record was not logged');
      assert.ok(failed()[0].includes(`term ${term.fence}`), failed()[0]);
      assert.equal(term.signal.aborted, false, 'the term ended for its record');
    } finally {
      await leadership.stop();
      await redis.del(`lock:{${key}}:leader`);
    }
  });

  it("a failed write of a term's record whose answer comes after the term ended is not news (found by mutation testing)", async () => {
    const key = uniqueKey('leader');
    await redis.set(`lock:{${key}}:leader`, 'not a record'); // its write fails (WRONGTYPE)
    const proxy = await FaultProxy.start(() => server.port);
    const slow = await startLockModule({ connection: `redis://127.0.0.1:${proxy.port}` });
    const from = logs.capture.lines.length;
    try {
      await slow.locks.isLocked(uniqueKey()); // a connection, before the latency
      // The term's record answers 300 ms after it began; the term ends at once (its work stops
      // the campaign), so the failure comes after the term.
      let ended!: Promise<void>;
      const leadership: Leadership = slow.locks.lead(key, async () => {
        proxy.setLatency(150);
        ended = leadership.stop();
        await ended;
      });
      assert.ok(await eventually(() => ended !== undefined, 5_000), 'never led');
      await ended;
      await sleep(600); // the record's failed answer has come by now
      const said = logs.capture.lines
        .slice(from)
        .filter(
          ({ level, message }) => level === 'warn' && message.includes('Could not record term'),
        );
      assert.deepEqual(said, []);
    } finally {
      proxy.setLatency(0);
      await slow.close();
      await proxy.close();
      await redis.del(`lock:{${key}}:leader`);
    }
  });

  it('stop() during the pause between terms settles at once, not after the pause', async () => {
    const app = await startLockModule({
      connection: server.url,
      defaults: { retryInterval: 5_000 },
    });
    try {
      let terms = 0;
      const leadership = app.locks.lead(uniqueKey('leader'), () => void terms++); // returns at once
      assert.ok(await eventually(() => terms === 1, 5_000));
      await sleep(50); // the term is over: the campaign pauses 5 s
      const watch = watchStalls();
      const started = performance.now();
      await leadership.stop();
      assertWithin(performance.now() - started, 0, watch, 'stop() during the pause');
      watch.stop();
      assert.equal(terms, 1);
    } finally {
      await app.close();
      // Its testing module put in a logger of its own: capture again for the tests after it.
      logs.restore();
      logs = LogCapture.install();
    }
  });

  it('a work that returns ends its term: isLeader and changes turn false until the next term; its deposed event says how long it led, and nothing warns of a loss', async () => {
    const key = uniqueKey('leader');
    const changes: boolean[] = [];
    const deposed: LockEvent[] = [];
    const subscription = apps[0].locks.events.subscribe((event) => {
      if (event.type === 'deposed' && event.key === key) deposed.push(event);
    });
    const began = performance.now();
    let terms = 0;
    const leadership = apps[0].locks.lead(key, async ({ signal }) => {
      if (++terms === 1) return; // the first term's work returns at once
      await new Promise((resolve) => signal.addEventListener('abort', resolve, { once: true }));
    });
    leadership.changes.subscribe((leading) => changes.push(leading));
    try {
      assert.ok(await eventually(() => terms === 2 && leadership.isLeader, 5_000));
      assert.deepEqual(changes, [true, false, true]);
      const [first] = deposed as Extract<LockEvent, { type: 'deposed' }>[];
      assert.equal(first?.reason, 'settled');
      assert.ok(
        first.heldMs >= 0 && first.heldMs <= performance.now() - began,
        `held ${first.heldMs} ms`,
      );
    } finally {
      subscription.unsubscribe();
      await leadership.stop();
    }
    assert.deepEqual(changes, [true, false, true, false]);
    const lost = logs.capture.lines.filter(
      ({ level, message }) =>
        level === 'warn' && message.includes('Lost leadership') && message.includes(key),
    );
    assert.deepEqual(
      lost,
      [],
      'a term whose work returned, or that stop() ended, warned of a loss',
    );
  });

  it('followers in one process poll as one: an attempt per retryInterval, not one per follower', async (t) => {
    const key = uniqueKey('leader');
    const leader = apps[0].locks.lead(key, new Terms().leadUntilAborted());
    const followers: Leadership[] = [];
    const monitor = await monitorRedis(server.port);
    try {
      assert.ok(await eventually(() => leader.isLeader, 5_000));
      for (let i = 0; i < 3; i++)
        followers.push(apps[1].locks.lead(key, new Terms().leadUntilAborted()));
      await sleep(300); // the campaigns settle into waiting
      await monitor.caughtUp();
      const before = scriptCalls(monitor.commands, ACQUIRE_SCRIPT, `lock:{${key}}`);
      await sleep(1_000);
      await monitor.caughtUp();
      const polls = scriptCalls(monitor.commands, ACQUIRE_SCRIPT, `lock:{${key}}`) - before;
      t.diagnostic(`${polls} attempts in 1 s`);
      // retryInterval is 100 ms here (+ up to 50 ms of jitter): 6 to 10 attempts in 1 s; three
      // followers each on its own timer would make 20 to 30. (A loaded machine makes fewer.)
      assert.ok(
        polls >= 2 && polls <= 11,
        `${polls} attempts in 1 s from 3 followers in one process`,
      );
      assert.equal(followers.filter((follower) => follower.isLeader).length, 0);
    } finally {
      monitor.stop();
      await Promise.all([leader, ...followers].map((leadership) => leadership.stop()));
    }
  });

  it('a term whose work throws is logged and the campaign goes on; a work that returns leads again', async () => {
    const key = uniqueKey('leader');
    const fences: number[] = [];
    const began: number[] = [];
    const watch = watchStalls();
    const leadership = apps[0].locks.lead(key, async ({ fence, signal }) => {
      fences.push(fence);
      began.push(performance.now());
      if (fences.length === 1) throw new Error('ingest failed');
      if (fences.length === 2) return;
      await new Promise((resolve) => signal.addEventListener('abort', resolve, { once: true }));
    });
    assert.ok(await eventually(() => fences.length === 3, 10_000), `terms: ${fences.join(', ')}`);
    assert.ok(fences[1] > fences[0] && fences[2] > fences[1], fences.join(', '));
    // The campaign goes on after retryInterval (100 ms here), not at once: a work that returns
    // at once does not spin.
    for (const i of [1, 2]) {
      assertWithin(began[i] - began[i - 1], 100, watch, `term ${i + 1} after term ${i}`, 95);
    }
    watch.stop();
    assert.equal(leadership.isLeader, true);
    await leadership.stop();
    const failed = logs.capture.lines.filter(
      ({ level, message }) => level === 'error' && message.includes(key),
    );
    assert.equal(failed.length, 1, JSON.stringify(failed));
    assert.match(failed[0].message, /ingest failed/);
  });

  it('a lost lock aborts the term (LockLostError), the leader steps down, and the campaign takes a new term', async () => {
    const key = uniqueKey('leader');
    const store = new FencedStore();
    const reasons: unknown[] = [];
    const terms = new Terms();
    const leadership = apps[1].locks.lead(
      key,
      terms.leadUntilAborted(({ fence, signal }) => {
        assert.equal(store.write(fence), true);
        signal.addEventListener('abort', () => reasons.push(signal.reason), { once: true });
      }),
      { ttl: 600 },
    );
    assert.ok(await eventually(() => leadership.isLeader, 5_000));
    // Someone deletes the key (a FLUSHALL, an operator): the next extension finds it gone.
    // (Beside it: the election's record and its participants, which leader() reads.)
    const names = (await redis.keys(`*${key}*`)).filter((name) => name.endsWith('}'));
    assert.equal(names.length, 1, `the lock's key among ${names.join(', ')}`);
    await redis.del(names[0]);
    assert.ok(await eventually(() => reasons.length === 1, 5_000), 'the term signal aborted');
    assert.ok(reasons[0] instanceof LockLostError, String(reasons[0]));
    const lost = (): string[] =>
      logs.capture.lines
        .filter(({ level, message }) => level === 'warn' && message.startsWith('Lost leadership'))
        .map(({ message }) => message)
        .filter((message) => message.includes(key));
    assert.ok(await eventually(() => lost().length === 1), 'the lost term was not logged');
    assert.match(lost()[0], /^Lost leadership of .* \(term \d+\): LockLostError/);
    assert.ok(await eventually(() => terms.fences.length === 2 && leadership.isLeader, 5_000));
    assert.ok(terms.fences[1] > terms.fences[0]);
    assert.equal(store.write(terms.fences[0]), false, "the old term's writes are rejected");
    await leadership.stop();
    assert.ok(reasons[1] instanceof LeadershipStoppedError, String(reasons[1]));
    assert.equal(reasons[1].by, 'stop');
    assert.equal(lost().length, 1, `a stopped term was logged as lost: ${lost().join(' / ')}`);
    const generic = logs.capture.lines.filter(
      ({ message }) => message.includes(key) && message.includes('lost before the work finished'),
    );
    assert.deepEqual(generic, [], 'the lost term was warned about twice');
  });

  it("isLeader and changes turn false the moment the term's signal aborts, while the work still runs", async () => {
    const key = uniqueKey('leader');
    let signal: AbortSignal | undefined;
    let returned = false;
    const changes: boolean[] = [];
    const leadership = apps[2].locks.lead(
      key,
      async (term) => {
        signal = term.signal;
        await new Promise((resolve) => term.signal.addEventListener('abort', resolve));
        await sleep(500); // a work that takes a while to wind down
        returned = true;
      },
      { ttl: 600 },
    );
    leadership.changes.subscribe((leading) => changes.push(leading));
    try {
      assert.ok(await eventually(() => leadership.isLeader, 5_000));
      // The lock is lost (deleted): the next extension finds it gone and the signal aborts.
      const names = (await redis.keys(`*${key}*`)).filter((name) => name.endsWith('}'));
      await redis.del(names[0]);
      assert.ok(await eventually(() => signal?.aborted === true, 5_000));
      assert.equal(returned, false, 'the work still runs');
      assert.equal(leadership.isLeader, false);
      assert.deepEqual(changes, [true, false]);
    } finally {
      await leadership.stop();
    }
  });

  it('stop() from inside the work settles without waiting for it: the term aborts, the lock is released, and another instance leads', async () => {
    const key = uniqueKey('leader');
    let finish!: () => void;
    const draining = new Promise<void>((resolve) => (finish = resolve));
    let signal: AbortSignal | undefined;
    let stoppedInside = false;
    let workEnded = false;
    const leadership: Leadership = apps[0].locks.lead(key, async (term) => {
      signal = term.signal;
      await leadership.stop(); // steps down on its own, then drains
      stoppedInside = true;
      await draining;
      workEnded = true;
    });
    assert.ok(await eventually(() => stoppedInside, 5_000), 'stop() from the work never settled');
    assert.equal(workEnded, false, 'stop() waited for the work that called it');
    assert.equal(signal!.aborted, true);
    assert.equal(leadership.isLeader, false);
    assert.equal(await redis.exists(`lock:{${key}}`), 0, 'the watchdog kept the key');
    // Another instance leads, while the old work still drains.
    const next = apps[1].locks.lead(key, new Terms().leadUntilAborted());
    assert.ok(await eventually(() => next.isLeader, 5_000));
    await next.stop();
    finish();
    await leadership.stop();
    assert.equal(workEnded, true);
  });

  it("stop() from inside the work does not wait for it either once the term's lock was released behind its back (found by the model suite)", async () => {
    const key = uniqueKey('leader');
    let settled = false;
    const leadership: Leadership = apps[0].locks.lead(key, async () => {
      await getCurrentLock(key)!.release(); // an operator, a bug
      await leadership.stop();
      settled = true;
    });
    assert.ok(await eventually(() => settled, 3_000), 'stop() from inside never settled');
    await leadership.stop();
  });

  it('a grant that lands after stop() starts no term: the work never runs and isLeader never turns true', async () => {
    const key = uniqueKey('leader');
    const changes: boolean[] = [];
    let ran = false;
    let leadership: Leadership | undefined;
    // Stopped the moment the lock is granted, before the term would start.
    const subscription = apps[0].locks.events.subscribe((event) => {
      if (event.type === 'acquired' && event.key === key) void leadership?.stop();
    });
    try {
      leadership = apps[0].locks.lead(key, () => {
        ran = true;
      });
      leadership.changes.subscribe((leading) => changes.push(leading));
      await leadership.stop();
      assert.equal(ran, false, 'the work ran with its signal already aborted');
      assert.deepEqual(changes, []);
      assert.equal(leadership.isLeader, false);
      assert.equal(await redis.exists(`lock:{${key}}`), 0);
    } finally {
      subscription.unsubscribe();
    }
  });

  it('rejects bad arguments with LockArgumentError, synchronously', () => {
    const locks = apps[0].locks;
    const work = async (): Promise<void> => {};
    for (const [key, fn, options, argument] of [
      ['', work, undefined, 'key'],
      ['k', 'work', undefined, 'work'],
      ['k', work, { ttl: 0 }, 'ttl'],
      ['k', work, { ttl: 1.5 }, 'ttl'],
      ['k', work, { acquireTimeout: 10 }, 'acquireTimeout'],
      ['k', work, 'fast', 'options'],
    ] as const) {
      assert.throws(
        () => locks.lead(key, fn as never, options as never),
        (error) => error instanceof LockArgumentError && error.argument === argument,
        `${argument}: ${JSON.stringify(options)}`,
      );
    }
  });

  it('with Redis not answering, the campaign keeps trying, logs the outage once and its end once, leads when Redis is back, and stop() settles at once', async () => {
    const proxy = await FaultProxy.start(() => server.port);
    const app = await startLockModule({
      connection: `redis://127.0.0.1:${proxy.port}`,
      commandTimeout: 200,
      defaults: { retryInterval: 100 },
    });
    const { capture, restore } = LogCapture.install();
    try {
      proxy.stall();
      let led = false;
      const work = async ({ signal }: LeaderTerm): Promise<void> => {
        led = true;
        await new Promise((resolve) => signal.addEventListener('abort', resolve, { once: true }));
      };
      const leadership = app.locks.lead(uniqueKey('leader'), work);
      const lines = (level: string): string[] =>
        capture.lines
          .filter((line) => line.level === level && line.message.includes('Campaign'))
          .map(({ message }) => message);
      assert.ok(await eventually(() => lines('warn').length >= 1, 10_000), 'the outage is logged');
      await sleep(1_500); // several more attempts (one every ~300 ms): no more lines
      assert.equal(lines('warn').length, 1, lines('warn').join('\n'));
      assert.match(lines('warn')[0], /failed; trying again every 100 ms/);
      assert.equal(leadership.isLeader, false);
      assert.equal(led, false);
      proxy.heal();
      assert.ok(await eventually(() => leadership.isLeader, 10_000), 'leads once Redis is back');
      assert.equal(lines('log').length, 1);
      const [, failed] = /works again after \d+\.\d s \((\d+) failed attempts\)/.exec(
        lines('log')[0],
      ) ?? [lines('log')[0], '0'];
      // It kept trying through the outage: one attempt every commandTimeout + retryInterval
      // (~300 ms) for at least the 1.5 s above.
      assert.ok(Number(failed) >= 4, lines('log')[0]);
      await leadership.stop();
    } finally {
      restore();
      proxy.heal();
      await app.close();
      await proxy.close();
    }
  });

  it('a campaign waiting behind another leader says at once when Redis is back, not when it next leads (found by a review)', async () => {
    const proxy = await FaultProxy.start(() => server.port);
    const app = await startLockModule({
      connection: `redis://127.0.0.1:${proxy.port}`,
      commandTimeout: 200,
      defaults: { retryInterval: 100 },
    });
    const other = await startLockModule({ connection: server.url });
    const key = uniqueKey('leader');
    const held = await other.locks.acquire(key, { ttl: 60_000 });
    const { capture, restore } = LogCapture.install();
    try {
      await app.locks.isLocked(key); // connected before the outage
      const leadership = app.locks.lead(key, async () => {});
      const lines = (level: string): string[] =>
        capture.lines
          .filter((line) => line.level === level && line.message.includes('Campaign'))
          .map(({ message }) => message);
      proxy.stall();
      assert.ok(await eventually(() => lines('warn').length === 1, 10_000), 'the outage');
      proxy.heal();
      assert.ok(
        await eventually(() => lines('log').length === 1, 5_000),
        'its end, while another instance still leads',
      );
      assert.equal(leadership.isLeader, false);
      proxy.stall();
      assert.ok(await eventually(() => lines('warn').length === 2, 10_000), 'a second outage');
      proxy.heal();
      await leadership.stop();
    } finally {
      restore();
      proxy.heal();
      await held.release();
      await other.close();
      await app.close();
      await proxy.close();
    }
  });

  it('elected() resolves with the term: at once while leading, at the next term for a follower; a timeout, a signal or stop() ends only the wait', async () => {
    const key = uniqueKey('leader');
    const terms = new Terms();
    const leader = apps[0].locks.lead(key, terms.leadUntilAborted());
    const term = await leader.elected({ timeout: 5_000 });
    assert.equal(leader.isLeader, true);
    assert.deepEqual([term.key, term.id, term.fence], [key, leader.id, terms.fences[0]]);
    assert.equal(term.signal.aborted, false);
    assert.equal(await leader.elected({ timeout: 0 }), term, 'leading now: the same term at once');

    const follower = apps[1].locks.lead(key, terms.leadUntilAborted());
    // timeout 0 answers whether it leads now; a timeout is measured from the call.
    await assert.rejects(follower.elected({ timeout: 0 }), LeaderElectionTimeoutError);
    const watch = watchStalls();
    const started = performance.now();
    const late = await follower.elected({ timeout: 300 }).catch((error: unknown) => error);
    // A timer may fire up to a millisecond early on this clock.
    assertWithin(performance.now() - started, 300, watch, 'elected({ timeout: 300 })', 299);
    watch.stop();
    assert.ok(late instanceof LeaderElectionTimeoutError, String(late));
    assert.deepEqual([late.key, late.timeout], [key, 300]);
    assert.match(late.message, /within 300 ms.*The campaign goes on/);
    const cancel = new AbortController();
    const cancelled = follower.elected({ signal: cancel.signal });
    cancel.abort(new Error('user left'));
    const aborted = await cancelled.catch((error: unknown) => error);
    assert.ok(aborted instanceof LockAcquireAbortedError, String(aborted));
    assert.match(aborted.message, /^Waiting to lead /);
    assert.equal((aborted.cause as Error).message, 'user left');
    await assert.rejects(follower.elected({ signal: cancel.signal }), LockAcquireAbortedError);
    assert.equal(follower.isLeader, false, 'the waits that ended changed nothing');

    // The follower's next term: the leader steps down.
    const next = follower.elected();
    await leader.stop();
    const second = await next;
    assert.equal(follower.isLeader, true);
    assert.equal(second.fence, terms.fences[1]);
    assert.ok(second.fence > term.fence);
    assert.equal(second.signal.aborted, false);
    await assert.rejects(leader.elected(), (error: unknown) => {
      assert.ok(error instanceof LeadershipStoppedError && error.by === 'stop', String(error));
      return true;
    });

    // stop() ends a wait in progress; bad options are refused.
    const third = apps[2].locks.lead(key, terms.leadUntilAborted());
    const waiting = third.elected().catch((error: unknown) => error);
    await third.stop();
    assert.ok((await waiting) instanceof LeadershipStoppedError);
    for (const options of [{ timeout: -1 }, { timeout: '5' }, { signal: {} }, { wait: 1 }, 5]) {
      await assert.rejects(follower.elected(options as never), LockArgumentError);
    }
    await follower.stop();
  });

  it('a participant id of its own or one per LockService; elected and deposed events name it, with the fence and why the term ended', async () => {
    const key = uniqueKey('leader');
    const events: LockEvent[] = [];
    const subscription = apps[0].locks.events.subscribe((event) => {
      if (event.type === 'elected' || event.type === 'deposed') events.push(event);
    });
    try {
      let terms = 0;
      const named = apps[0].locks.lead(
        key,
        async ({ signal }) => {
          if (++terms === 1) return; // the first term's work settles at once
          await new Promise((resolve) => signal.addEventListener('abort', resolve, { once: true }));
        },
        { id: 'pod-a', ttl: 600 },
      );
      assert.equal(named.id, 'pod-a');
      assert.ok(await eventually(() => terms === 2 && named.isLeader, 5_000));
      const term = await named.elected();
      assert.equal(term.id, 'pod-a');
      // The key deleted behind its back: the term is lost at the next extension (every 200 ms).
      const names = (await redis.keys(`*${key}*`)).filter((name) => name.endsWith('}'));
      await redis.del(names);
      assert.ok(await eventually(() => terms === 3 && named.isLeader, 5_000));
      await named.stop();
      const fences = events
        .filter(({ type }) => type === 'elected')
        .map((e) => (e as { fence: number }).fence);
      assert.equal(fences.length, 3);
      assert.deepEqual(
        events.map((event) => ({
          ...event,
          heldMs: 'heldMs' in event ? typeof event.heldMs : undefined,
        })),
        [
          { type: 'elected', key, id: 'pod-a', fence: fences[0], heldMs: undefined },
          {
            type: 'deposed',
            key,
            id: 'pod-a',
            fence: fences[0],
            reason: 'settled',
            heldMs: 'number',
          },
          { type: 'elected', key, id: 'pod-a', fence: fences[1], heldMs: undefined },
          { type: 'deposed', key, id: 'pod-a', fence: fences[1], reason: 'lost', heldMs: 'number' },
          { type: 'elected', key, id: 'pod-a', fence: fences[2], heldMs: undefined },
          { type: 'deposed', key, id: 'pod-a', fence: fences[2], reason: 'stop', heldMs: 'number' },
        ],
      );
    } finally {
      subscription.unsubscribe();
    }
    // Without an id: one per LockService, the host name, the process id and a random part.
    const [a, b] = [uniqueKey('leader'), uniqueKey('leader')].map((each) =>
      apps[0].locks.lead(each, async () => {}),
    );
    const other = apps[1].locks.lead(uniqueKey('leader'), async () => {});
    assert.match(a.id, new RegExp(`^${hostname()}:${process.pid}:[0-9a-f]{8}$`));
    assert.equal(b.id, a.id);
    assert.notEqual(other.id, a.id);
    await Promise.all([a, b, other].map((leadership) => leadership.stop()));
    for (const id of ['', 7, 'x'.repeat(201), '\ud800']) {
      assert.throws(
        () => apps[0].locks.lead(key, async () => {}, { id } as never),
        LockArgumentError,
      );
    }
  });

  it('a campaign stays listed among the participants for as long as it runs, past its TTL: it renews its place every third of it (found by mutation testing)', async () => {
    const key = uniqueKey('leader');
    // Long enough that a stalled machine does not let a place lapse between two renewals (500 ms
    // apart); checked past one TTL and past two.
    const ttl = 1_500;
    const [leading, following] = [apps[0], apps[1]].map((app) =>
      app.locks.lead(key, new Terms().leadUntilAborted(), { ttl }),
    );
    try {
      assert.ok(await eventually(async () => (await apps[2].locks.participants(key)).length === 2));
      const both = [leading.id, following.id].sort();
      await sleep(ttl + 300);
      assert.deepEqual(await apps[2].locks.participants(key), both, 'past one TTL');
      await sleep(ttl);
      assert.deepEqual(await apps[2].locks.participants(key), both, 'past two TTLs');
    } finally {
      await Promise.all([leading.stop(), following.stop()]);
    }
  });

  it('locks.leadership(key) is the running leadership of key, from lead(); undefined once stopped or never started', async () => {
    const key = uniqueKey('leader');
    assert.equal(apps[0].locks.leadership(key), undefined);
    const leadership = apps[0].locks.lead(key, new Terms().leadUntilAborted());
    assert.equal(apps[0].locks.leadership(key), leadership);
    assert.equal(apps[1].locks.leadership(key), undefined, "another service's is not this one's");
    assert.equal(apps[0].locks.leadership(uniqueKey('leader')), undefined, "another key's");
    const stopping = leadership.stop();
    assert.equal(apps[0].locks.leadership(key), undefined, 'listed while it stops');
    await stopping;
    assert.equal(apps[0].locks.leadership(key), undefined);
    // Nor kept once over (found by mutation testing: a stopped campaign stayed in the service).
    const campaigns = (apps[0].locks as unknown as { leaderships: { campaigns: Set<unknown> } })
      .leaderships.campaigns;
    assert.ok(await eventually(() => campaigns.size === 0), `${campaigns.size} campaigns kept`);
    assert.throws(() => apps[0].locks.leadership(''), LockArgumentError);
  });

  it('elected(): timeout 0 answers at once, a timeout never ends early, an aborted signal is refused even while leading; the term it gives aborts when its work settles (found by a review)', async () => {
    const key = uniqueKey('leader');
    let settle: (() => void) | undefined;
    const leadership = apps[0].locks.lead(key, () => new Promise<void>((r) => (settle = r)));
    // Not leading yet (the grant is on its way): timeout 0 says so now, not after a timer.
    await assert.rejects(leadership.elected({ timeout: 0 }), LeaderElectionTimeoutError);
    const term = await leadership.elected();
    const aborted = new AbortController();
    aborted.abort();
    await assert.rejects(leadership.elected({ signal: aborted.signal }), LockAcquireAbortedError);
    settle!(); // the work returns: its term is over, and whoever kept its signal is told
    assert.ok(await eventually(() => term.signal.aborted, 2_000), 'the term signal aborted');
    const reason = term.signal.reason as LockLostError;
    assert.ok(reason instanceof LockLostError && reason.reason === 'released', String(reason));
    await leadership.stop();

    const follower = apps[1].locks.lead(uniqueKey('leader'), async () => {});
    const other = apps[2].locks.lead(
      (follower as unknown as { key: string }).key,
      new Terms().leadUntilAborted(),
    );
    await other.elected();
    const early: string[] = [];
    for (let i = 0; i < 100; i++) {
      const timeout = 1 + (i % 20);
      const started = performance.now();
      await assert.rejects(follower.elected({ timeout }), LeaderElectionTimeoutError);
      const took = performance.now() - started;
      if (took < timeout) early.push(`${took.toFixed(2)} < ${timeout}`);
    }
    assert.deepEqual(early, [], 'waits that ended before their timeout');
    await follower.stop();
    await other.stop();
  });

  it('a grant whose lease ran out before its term began (a stalled process) starts no term; a listener that stops the leadership as it begins runs no work, and everyone hears true before false (found by a review)', async () => {
    const key = uniqueKey('leader');
    const events: LockEvent[] = [];
    let stalled = false;
    const subscription = apps[0].locks.events.subscribe((event) => {
      if (event.key !== key) return;
      events.push(event);
      if (event.type === 'acquired' && !stalled) {
        stalled = true;
        const until = performance.now() + 260; // past the 200 ms lease, before the term begins
        while (performance.now() < until);
      }
    });
    const starts: boolean[] = [];
    const seen: { isLeader: boolean; aborted: boolean }[] = [];
    const leadership = apps[0].locks.lead(
      key,
      async ({ signal }) => {
        starts.push(signal.aborted);
        await new Promise((resolve) => signal.addEventListener('abort', resolve, { once: true }));
      },
      // Long enough that a later grant is not also outlived by a stall of a loaded machine.
      { ttl: 200 },
    );
    try {
      const term = await leadership.elected({ timeout: 30_000 });
      seen.push({ isLeader: leadership.isLeader, aborted: term.signal.aborted });
      assert.ok(stalled, 'the first grant was stalled');
      assert.deepEqual(starts.slice(0, 1), [false], 'a work began with its signal aborted');
      const watch = watchStalls();
      const settledAt = performance.now();
      await leadership.stop();
      // stop() aborts the work, which settles at once: the release's reply is all it waits for.
      assertWithin(performance.now() - settledAt, 0, watch, 'stop() of the term');
      watch.stop();
    } finally {
      subscription.unsubscribe();
    }
    assert.deepEqual(seen, [{ isLeader: true, aborted: false }]);
    // Each term that began ended, in order; none began for the stalled grant.
    const terms = events.filter(({ type }) => type === 'elected' || type === 'deposed');
    assert.ok(terms.length >= 2 && terms.length % 2 === 0, JSON.stringify(terms));
    terms.forEach((event, i) => assert.equal(event.type, i % 2 === 0 ? 'elected' : 'deposed'));
    const lostFirst = events.findIndex(({ type }) => type === 'lost');
    const firstElected = events.findIndex(({ type }) => type === 'elected');
    assert.ok(
      lostFirst >= 0 && lostFirst < firstElected,
      JSON.stringify(events.map((e) => e.type)),
    );

    // A changes subscriber that stops it as it hears true: no work, true then false for all.
    const other = uniqueKey('leader');
    const heard: boolean[][] = [[], []];
    const order: string[] = [];
    const watcher = apps[0].locks.events.subscribe((event) => {
      if (event.key === other && (event.type === 'elected' || event.type === 'deposed')) {
        order.push(event.type);
      }
    });
    let ran = false;
    const stopping = apps[0].locks.lead(other, () => void (ran = true));
    stopping.changes.subscribe((leading) => {
      heard[0].push(leading);
      if (leading) void stopping.stop();
    });
    stopping.changes.subscribe((leading) => heard[1].push(leading));
    try {
      assert.ok(await eventually(() => heard[1].length === 2, 5_000), JSON.stringify(heard));
      await stopping.stop();
    } finally {
      watcher.unsubscribe();
    }
    assert.deepEqual(heard, [
      [true, false],
      [true, false],
    ]);
    assert.deepEqual(order, ['elected', 'deposed']);
    assert.equal(ran, false, 'the work ran with its term already over');
  });

  it('lead() once the module is shutting down throws RedisLockShutdownError', async () => {
    const app = await startLockModule({ connection: server.url });
    await app.close();
    assert.throws(
      () => app.locks.lead(uniqueKey('leader'), async () => {}),
      RedisLockShutdownError,
    );
  });

  it('two campaigns with one id: one that stops leaves the other listed; a term a listener ends as it begins still counts (found by a review)', async () => {
    const key = uniqueKey('leader');
    const work = ({ signal }: LeaderTerm): Promise<unknown> =>
      new Promise((resolve) => signal.addEventListener('abort', resolve));
    // Stopped by a `changes` subscriber the moment its term begins: a term all the same.
    const stopping = apps[0].locks.lead(key, work, { id: 'pod-x' });
    stopping.changes.subscribe((leading) => {
      if (leading) void stopping.stop();
    });
    await assert.rejects(stopping.elected(), { name: 'LeadershipStoppedError' });
    await stopping.stop();
    // Two campaigns of one app, one id (the service's default).
    const leading = apps[1].locks.lead(key, work);
    const term = await leading.elected();
    const following = apps[1].locks.lead(key, work);
    assert.ok(
      await eventually(async () => (await apps[2].locks.leader(key))?.fence === term.fence),
    );
    assert.equal((await apps[2].locks.leader(key))?.transitions, 2, 'the first term not counted');
    assert.ok(await eventually(async () => (await apps[2].locks.participants(key)).length === 1));
    await following.stop();
    assert.deepEqual(
      await apps[2].locks.participants(key),
      [leading.id],
      'a campaign running was dropped',
    );
    await leading.stop();
    assert.deepEqual(await apps[2].locks.participants(key), []);
  });

  it("a term's lease renewed never reads as renewed before its term began, also when the term's record was written well after the grant (a loaded CI run read 6 ms before)", async () => {
    const key = uniqueKey('leader');
    const leadership = apps[0].locks.lead(
      key,
      ({ signal }) => new Promise((resolve) => signal.addEventListener('abort', resolve)),
      { ttl: 3_000 },
    );
    try {
      await leadership.elected();
      // The term's record follows its grant (written once the term began).
      const record = `lock:{${key}}:leader`;
      assert.ok(await eventually(async () => (await redis.hget(record, 'since')) !== null));
      // As if written 200 ms after the grant that set the term's first lease.
      const since = Number(await redis.hget(record, 'since')) + 200;
      await redis.hset(record, 'since', since);
      const info = await apps[1].locks.leader(key);
      assert.equal(info?.since.getTime(), since);
      assert.ok(
        info.renewedAt.getTime() >= since,
        `renewed ${info.renewedAt.getTime() - since} ms after its term began`,
      );
    } finally {
      await leadership.stop();
    }
  });

  it('anyone reads who leads (id, fence, since, renewedAt, transitions) and who campaigns; a stopped campaign drops out', async () => {
    const key = uniqueKey('leader');
    const started = Date.now();
    await assertElectionReadable([apps[0].locks, apps[1].locks], apps[2].locks, key, {
      onFirstTerm: async (info) => {
        // Redis's clock, on this machine: the term began after the campaigns started.
        assert.ok(info.since.getTime() >= started - 50, `since ${info.since.toISOString()}`);
        assert.ok(info.renewedAt.getTime() >= info.since.getTime());
        assert.ok(info.renewedAt.getTime() <= Date.now() + 50);
        const handle = apps[0].locks.leadership(key);
        const again = await handle?.leader();
        assert.ok(again, "the campaign's handle reads a leader");
        // The same term; `renewedAt` only forward (a renewal may come between the two reads, and
        // it is derived from Redis's ms clock and the lock's PTTL: ±1 ms between reads).
        const { renewedAt, ...term } = again;
        const { renewedAt: first, ...expected } = info;
        assert.deepEqual(term, expected, "the campaign's handle reads the same");
        assert.ok(
          renewedAt.getTime() >= first.getTime() - 1,
          `renewedAt ${renewedAt.toISOString()}`,
        );
        // Its watchdog extends the lease every third of its TTL (1 s): renewedAt follows.
        assert.ok(
          await eventually(
            async () =>
              ((await apps[2].locks.leader(key))?.renewedAt.getTime() ?? 0) >
              info.renewedAt.getTime(),
            3_000,
          ),
          'renewedAt never moved',
        );
      },
    });
  });
});

interface Work {
  readonly by: object;
  readonly key: string;
  readonly fence: number;
  reason?: unknown;
}
const worked: Work[] = [];

@Injectable()
class Ingest {
  @WhileLeader('leader:ingest', { ttl: 60_000 })
  async ingest({ key, fence, signal }: LeaderTerm): Promise<void> {
    const entry: Work = { by: this, key, fence };
    worked.push(entry);
    await new Promise((resolve) => signal.addEventListener('abort', resolve, { once: true }));
    entry.reason = signal.reason;
  }
}

class Compactor {
  @WhileLeader('leader:compact')
  async compact({ key, fence, signal }: LeaderTerm): Promise<void> {
    worked.push({ by: this, key, fence });
    await new Promise((resolve) => signal.addEventListener('abort', resolve, { once: true }));
  }
}

describe('@WhileLeader', { timeout: 90_000 }, () => {
  let server: RedisServer;
  before(async () => {
    server = await startRedis();
  });
  after(async () => {
    await server?.stop();
  });

  it('campaigns from bootstrap (class and useFactory providers) and hands over at shutdown', async () => {
    const options = { connection: server.url, keyPrefix: `${uniqueKey('app')}:` };
    const providers = [Ingest, { provide: 'compactor', useFactory: () => new Compactor() }];
    const first = await startLockModule(options, providers);
    const second = await startLockModule(options, providers);
    try {
      assert.ok(await eventually(() => worked.length === 2, 5_000), JSON.stringify(worked));
      assert.deepEqual(worked.map(({ key }) => key).sort(), ['leader:compact', 'leader:ingest']);
      const ingest = worked.find(({ key }) => key === 'leader:ingest')!;
      // Whichever app leads ingest: closing it stops the term and the other leads at once
      // (the TTL is 60 s).
      const leader = first.module.get(Ingest) === ingest.by ? first : second;
      await leader.close();
      assert.ok(ingest.reason instanceof LeadershipStoppedError, String(ingest.reason));
      assert.equal(ingest.reason.by, 'shutdown');
      assert.ok(
        await eventually(() => worked.filter(({ key }) => key === 'leader:ingest').length === 2),
        'the other app leads ingest after the first closed',
      );
      const [before, after] = worked.filter(({ key }) => key === 'leader:ingest');
      assert.ok(after.fence > before.fence);
    } finally {
      await first.close();
      await second.close();
    }
  });

  it("locks.leadership(key) is a @WhileLeader method's handle: isLeader, elected(), stop(); a shutdown ends an elected() wait", async () => {
    const options = { connection: server.url, keyPrefix: `${uniqueKey('app')}:` };
    const first = await startLockModule(options, [Ingest]);
    const second = await startLockModule(options, [Ingest]);
    try {
      const handles = [first, second].map(({ locks }) => locks.leadership('leader:ingest')!);
      assert.ok(handles.every((handle) => handle !== undefined));
      const term = await Promise.race(handles.map((handle) => handle.elected()));
      const leading = handles.findIndex((handle) => handle.isLeader);
      assert.equal(handles.filter((handle) => handle.isLeader).length, 1);
      const entry = worked.find(({ fence }) => fence === term.fence)!;
      assert.ok(entry, 'the term elected() gave is the one the method runs');
      const following = handles[1 - leading];
      const waiting = following.elected();
      // The leader's method stopped through its handle: the follower leads at once (TTL 60 s).
      await handles[leading].stop();
      assert.ok(entry.reason instanceof LeadershipStoppedError, String(entry.reason));
      assert.equal(entry.reason.by, 'stop');
      assert.ok((await waiting).fence > term.fence);
      assert.equal([first, second][leading].locks.leadership('leader:ingest'), undefined);
      // The leader's app closes: a third's wait ends with the shutdown, not never.
      const third = await startLockModule(options, [Ingest]);
      const wait = third.locks
        .leadership('leader:ingest')!
        .elected()
        .catch((error: unknown) => error);
      await third.close();
      const error = await wait;
      assert.ok(error instanceof LeadershipStoppedError && error.by === 'shutdown', String(error));
    } finally {
      await first.close();
      await second.close();
    }
  });

  it('stops a leader before anything it depends on is destroyed: lock module global or not, leader in the root module or a feature module', async () => {
    for (const layout of ['global', 'imported', 'feature'] as const) {
      const key = uniqueKey('leader:db');
      /** A database the leader writes to, closed in its own onModuleDestroy. */
      @Injectable()
      class Db {
        open = true;
        readonly late: number[] = [];
        write(fence: number): void {
          if (!this.open) this.late.push(fence);
        }
        async onModuleDestroy(): Promise<void> {
          this.open = false;
          await sleep(30); // closing a pool takes a moment
        }
      }
      @Injectable()
      class Writer {
        constructor(readonly db: Db) {}
        @WhileLeader(key, { ttl: 5_000 })
        async lead({ fence, signal }: LeaderTerm): Promise<void> {
          while (!signal.aborted) {
            this.db.write(fence);
            await new Promise((resolve) => setTimeout(resolve, 2));
          }
        }
      }
      const lockModule = RedisLockModule.forRoot({
        connection: server.url,
        isGlobal: layout !== 'imported',
      });
      @Module({ providers: [Db, Writer] })
      class Feature {}
      const module = await Test.createTestingModule(
        layout === 'feature'
          ? { imports: [lockModule, Feature] }
          : { imports: [lockModule], providers: [Db, Writer] },
      ).compile();
      await module.init();
      const db = module.get(Db);
      const leading = await eventually(async () => module.get(LockService).isLocked(key));
      assert.ok(leading, `${layout}: never led`);
      await module.close();
      assert.deepEqual(db.late, [], `${layout}: the leader wrote after its database was closed`);
    }
  });

  it('warns about a request-scoped provider, which has no instance to lead with, and leads nothing', async () => {
    @Injectable({ scope: Scope.REQUEST })
    class PerRequest {
      @WhileLeader('leader:per-request')
      async run(): Promise<void> {}
    }
    const module = await Test.createTestingModule({
      imports: [RedisLockModule.forRoot({ connection: server.url })],
      providers: [PerRequest],
    }).compile();
    const { capture, restore } = LogCapture.install(); // after compile(): it installs its own logger
    try {
      await module.init();
      const warned = capture.lines.filter(
        ({ level, message }) => level === 'warn' && message.includes('PerRequest'),
      );
      assert.equal(warned.length, 1, JSON.stringify(capture.lines));
      assert.equal(await module.get(LockService).isLocked('leader:per-request'), false);
    } finally {
      restore();
      await module.close();
    }
  });

  it('checks its key and options when the class is defined', () => {
    const define = (key: unknown, options?: unknown): unknown => {
      class Job {
        @WhileLeader(key as string, options as never)
        async run(): Promise<void> {}
      }
      return Job;
    };
    for (const [key, options, option] of [
      ['', undefined, '@WhileLeader(Job.run).key'],
      [undefined, undefined, '@WhileLeader(Job.run).key'],
      ['k', { ttl: -1 }, '@WhileLeader(Job.run).ttl'],
      ['k', { acquireTimeout: 1 }, '@WhileLeader(Job.run).acquireTimeout'],
      ['k', 5, '@WhileLeader(Job.run)'],
      ['k', { id: '' }, '@WhileLeader(Job.run).id'],
    ] as const) {
      assert.throws(
        () => define(key, options),
        (error) => error instanceof RedisLockConfigurationError && error.option === option,
        option,
      );
    }
    assert.doesNotThrow(() => define('k', { ttl: 1_000, id: 'pod-a' }));
  });

  it("shutdown waits for every leader's work up to the longest TTL, and warns only of the work that did not return (found by mutation testing)", async () => {
    const [stuckKey, slowKey] = [uniqueKey('leader'), uniqueKey('leader')];
    const app = await startLockModule({ connection: server.url });
    const { capture, restore } = LogCapture.install();
    let release!: () => void;
    const stuck = new Promise<void>((resolve) => (release = resolve));
    try {
      // One work ignores its signal; the other returns 500 ms after it aborts, within its TTL
      // (1.5 s) but past the other's (300 ms).
      let slowReturned = false;
      const leaderships = [
        app.locks.lead(stuckKey, () => stuck, { ttl: 300 }),
        app.locks.lead(
          slowKey,
          async ({ signal }) => {
            await new Promise((resolve) =>
              signal.addEventListener('abort', resolve, { once: true }),
            );
            await sleep(500);
            slowReturned = true;
          },
          { ttl: 1_500 },
        ),
      ];
      assert.ok(await eventually(() => leaderships.every((each) => each.isLeader), 5_000));
      await app.close();
      assert.ok(slowReturned, 'shutdown did not wait for the work that returned within its TTL');
      const warned = capture.lines.filter(
        ({ level, message }) => level === 'warn' && message.includes('did not return'),
      );
      assert.equal(warned.length, 1, JSON.stringify(warned));
      assert.ok(warned[0].message.includes(stuckKey), warned[0].message);
    } finally {
      release();
      restore();
    }
  });

  it('a work that ignores its signal does not hold shutdown past its TTL, and is logged', async () => {
    const key = uniqueKey('leader');
    const app = await startLockModule({ connection: server.url });
    const redis = new Redis(server.port, '127.0.0.1');
    const { capture, restore } = LogCapture.install();
    try {
      let release!: () => void;
      const stuck = new Promise<void>((resolve) => (release = resolve));
      const leadership = app.locks.lead(key, () => stuck, { ttl: 500 });
      assert.ok(await eventually(() => leadership.isLeader, 5_000));
      await app.close();
      const held = (await redis.keys(`*${key}*`)).filter((name) => name.endsWith('}'));
      assert.deepEqual(held, [], 'the lock was released at shutdown all the same');
      const warned = capture.lines.filter(
        ({ level, message }) => level === 'warn' && message.includes('did not return'),
      );
      assert.equal(warned.length, 1, JSON.stringify(capture.lines));
      release();
      await leadership.stop();
    } finally {
      restore();
      redis.disconnect();
    }
  });
});
