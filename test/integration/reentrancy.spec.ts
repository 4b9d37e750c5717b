import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import { Injectable } from '@nestjs/common';
import { Redis } from 'ioredis';
import {
  getCurrentLock,
  LockAcquireAbortedError,
  LockAcquireTimeoutError,
  LockArgumentError,
  LockLostError,
  WithLock,
  type AcquireOptions,
  type LockService,
  type Lock,
  type LockEvent,
} from '../../lib/index.js';
import {
  eventually,
  sleep,
  startLockModule,
  uniqueKey,
  type LockModuleFixture,
} from '../support/lock-module.js';
import { assertWithin, watchStalls } from '../support/timing.js';
import { startRedis, type RedisServer } from '../support/redis-server.js';

/** An account whose debit is a read-modify-write with a pause in it: a lost update shows. */
class Ledger {
  balance = 100;
  inside = 0;
  mostInside = 0;
  readonly fences: number[] = [];

  async debit(amount: number): Promise<void> {
    this.inside++;
    this.mostInside = Math.max(this.mostInside, this.inside);
    const read = this.balance;
    await sleep(20);
    this.balance = read - amount;
    this.fences.push(getCurrentLock()!.fence);
    this.inside--;
  }
}

const ledger = new Ledger();

@Injectable()
class Accounts {
  @WithLock({ key: 'acct:{0}', acquireTimeout: 5_000 })
  async debit(_account: string, amount: number): Promise<void> {
    await ledger.debit(amount);
  }
}

/**
 * Re-entrancy is for a call nested in the holder's own flow (DESIGN §2): straight nesting never
 * deadlocks, while work forked inside a section — promises run side by side, timers — waits its
 * turn as two requests would, and nested options the outer hold cannot honour are refused.
 */
describe('re-entrancy', () => {
  let server: RedisServer;
  let app: LockModuleFixture;
  let locks: LockService;
  let accounts: Accounts;
  let redis: Redis;

  before(async () => {
    server = await startRedis();
    app = await startLockModule({ connection: server.url }, [Accounts]);
    locks = app.locks;
    accounts = app.module.get(Accounts);
    redis = new Redis(server.port, '127.0.0.1');
  });

  after(async () => {
    await app?.close();
    redis?.disconnect();
    await server?.stop();
  });

  const reset = (): void => {
    ledger.balance = 100;
    ledger.inside = ledger.mostInside = 0;
    ledger.fences.length = 0;
  };
  const debitWith = (key: string, amount: number): Promise<void> =>
    locks.using(key, () => ledger.debit(amount));

  describe('concurrent work forked inside a section takes turns', () => {
    it('Promise.all of two nested using() calls: one at a time, no lost update', async () => {
      reset();
      const key = uniqueKey('acct');
      await locks.using(key, async (outer) => {
        await Promise.all([debitWith(key, 10), debitWith(key, 20)]);
        assert.deepEqual(ledger.fences, [outer.fence, outer.fence], 'both ran in the outer hold');
      });
      assert.equal(ledger.balance, 70);
      assert.equal(ledger.mostInside, 1, 'two nested calls were inside at once');
    });

    it('Promise.all of two @WithLock provider calls inside a section: one at a time', async () => {
      reset();
      const account = uniqueKey('acct');
      await locks.using(`acct:${account}`, async () => {
        await Promise.all([accounts.debit(account, 10), accounts.debit(account, 20)]);
      });
      assert.equal(ledger.balance, 70);
      assert.equal(ledger.mostInside, 1);
    });

    it('@WithLock calling itself in parallel from a locked method: no deadlock, one at a time', async () => {
      reset();
      const account = uniqueKey('acct');
      @Injectable()
      class Batch {
        constructor(private readonly inner: Accounts) {}
        @WithLock({ key: 'acct:{0}', acquireTimeout: 5_000 })
        async run(id: string): Promise<void> {
          await Promise.all([this.inner.debit(id, 10), this.inner.debit(id, 20)]);
        }
      }
      const local = await startLockModule({ connection: server.url }, [Accounts, Batch]);
      try {
        await local.module.get(Batch).run(account);
      } finally {
        await local.close();
      }
      assert.equal(ledger.balance, 70);
      assert.equal(ledger.mostInside, 1);
    });

    it('a timer started in the section waits for the nested call that is inside', async () => {
      reset();
      const key = uniqueKey('acct');
      let timed: Promise<void> | undefined;
      await locks.using(key, async () => {
        setTimeout(() => {
          timed = debitWith(key, 10);
        }, 5);
        await debitWith(key, 20);
      });
      await sleep(10);
      assert.ok(timed, 'the timer ran');
      await timed;
      assert.equal(ledger.balance, 70);
      assert.equal(ledger.mostInside, 1);
    });

    it('work that outlives the section does not inherit its lock: it acquires the key afresh', async () => {
      reset();
      const key = uniqueKey('acct');
      let late: Promise<Lock> | undefined;
      let outerFence = 0;
      await locks.using(key, async (outer) => {
        outerFence = outer.fence;
        late = sleep(50).then(() => locks.acquire(key));
      });
      const lock = await late!;
      try {
        assert.ok(lock.fence > outerFence, 'a fresh hold, not a view of the ended one');
        assert.equal(await redis.get(`lock:{${key}}`), lock.token);
      } finally {
        await lock.release();
      }
    });

    it('a fork waiting for its turn when the section ends takes the key afresh, after the release', async () => {
      const key = uniqueKey();
      let forked: Promise<Lock> | undefined;
      let outerFence = 0;
      let view: Lock | undefined;
      await locks.using(key, async (outer) => {
        outerFence = outer.fence;
        view = await locks.acquire(key); // inside until the section's end: never released
        forked = locks.acquire(key, { acquireTimeout: 5_000 });
        await sleep(30);
      });
      assert.equal(await view!.release(), false, 'the view ended with the outer hold');
      const lock = await forked!;
      try {
        assert.ok(lock.fence > outerFence);
      } finally {
        await lock.release();
      }
    });

    it('forks waiting when the section ends take the key afresh within what is left of their acquireTimeout, and no longer (found by mutation testing)', async () => {
      const key = uniqueKey();
      let patient: Promise<Lock> | undefined;
      let hasty: Promise<Lock> | undefined;
      // The key stays taken 2 s after the grant (holdAtLeast), though the section ends sooner.
      await locks.using(
        key,
        async () => {
          await locks.acquire(key); // inside until the section's end
          patient = locks.acquire(key, { acquireTimeout: 5_000 });
          hasty = locks.acquire(key, { acquireTimeout: 300 });
          hasty.catch(() => {}); // asserted below
          await sleep(30);
        },
        { holdAtLeast: 2_000 },
      );
      const stalls = watchStalls();
      const started = performance.now();
      await assert.rejects(hasty!, LockAcquireTimeoutError);
      // Within what was left of its 300 ms, not until the hold is up.
      assertWithin(performance.now() - started, 300, stalls, 'the fork with 300 ms');
      stalls.stop();
      const lock = await patient!; // once the hold is up: not refused at once
      await lock.release();
    });

    it("a fork's wait is bounded: acquireTimeout, tryAcquire and an aborted signal end it", async () => {
      const key = uniqueKey();
      await locks.using(key, async () => {
        const inside = await locks.acquire(key);
        assert.equal(await locks.tryAcquire(key), null);
        const events: LockEvent[] = [];
        const subscription = locks.events.subscribe((event) => events.push(event));
        await assert.rejects(
          locks.acquire(key, { acquireTimeout: 50 }),
          (error) =>
            error instanceof LockAcquireTimeoutError &&
            error.key === key &&
            // Busy with the section's hold, for what is left of its lease.
            error.busy &&
            error.retryAfterMs! > 0 &&
            error.retryAfterMs! <= inside.expiresAt - performance.now() + 5,
        );
        subscription.unsubscribe();
        assert.deepEqual(
          events.filter((event) => event.type === 'timeout').map((event) => event.key),
          [key],
        );
        const controller = new AbortController();
        const aborted = locks.acquire(key, { acquireTimeout: 5_000, signal: controller.signal });
        setTimeout(() => controller.abort(), 20);
        const stalls = watchStalls();
        const started = performance.now();
        await assert.rejects(aborted, (error) => error instanceof LockAcquireAbortedError);
        // When it aborts, not at its deadline (found by mutation testing).
        assertWithin(performance.now() - started, 20, stalls, 'the aborted fork');
        stalls.stop();
        assert.equal(await inside.release(), true);
        // Now the turn is free again.
        const next = await locks.tryAcquire(key);
        assert.ok(next);
        assert.equal(await next.release(), true);
      });
    });

    it('a fork started inside a nested section and still inside when it ends keeps that level taken: the next nested call waits for it', async () => {
      reset();
      const key = uniqueKey('acct');
      let forked: Promise<void> | undefined;
      await locks.using(key, async () => {
        await locks.using(key, async () => {
          forked = debitWith(key, 10); // not awaited: outlives this nested section
          await sleep(1);
        });
        await debitWith(key, 20); // the section's next nested call
        await forked;
      });
      assert.equal(ledger.balance, 70, 'a lost update: the fork and the next call overlapped');
      assert.equal(ledger.mostInside, 1);
    });

    it("a fork still inside when its section ends is told: its own signal aborts (reason 'released') before anyone else can take the key", async () => {
      const key = uniqueKey();
      let forkSignal: AbortSignal | undefined;
      let release!: () => void;
      const held = new Promise<void>((resolve) => (release = resolve));
      let fork: Promise<void> | undefined;
      let outerSignal: AbortSignal | undefined;
      await locks.using(key, async (outer) => {
        outerSignal = outer.signal;
        fork = locks.using(key, async (lock) => {
          forkSignal = lock.signal;
          await held;
        });
        await sleep(5);
      });
      assert.ok(forkSignal, 'the fork went in');
      assert.equal(forkSignal.aborted, true, 'the fork runs on with a live signal');
      assert.equal((forkSignal.reason as LockLostError).reason, 'released');
      assert.equal(outerSignal!.aborted, false, "the section's own signal is not the fork's");
      const other = await locks.tryAcquire(key);
      assert.ok(other, 'the key is free once the section ended');
      await other.release();
      release();
      await fork;
    });

    it("a view released after its hold's lease ran out unnoticed aborts its signal first, as a hold's release does (found by the chaos suite)", async () => {
      const key = uniqueKey();
      let signal: AbortSignal | undefined;
      await locks.using(
        key,
        async () => {
          await locks.using(key, async (view) => {
            signal = view.signal;
            const until = performance.now() + 300;
            while (performance.now() < until); // the event loop blocked past the 200 ms lease
          });
          assert.equal(signal?.aborted, true, 'the overrun went unreported on the view');
        },
        { ttl: 200 },
      );
    });

    it('a forgotten nested acquire() is told when the outer use ends: its signal aborts', async () => {
      const key = uniqueKey();
      let view: Lock | undefined;
      await locks.using(key, async () => {
        view = await locks.acquire(key); // never released
      });
      assert.equal(view!.signal.aborted, true);
      assert.equal(await view!.release(), false);
      // Read after the end, the signal is aborted too.
      let late: Lock | undefined;
      await locks.using(key, async () => {
        late = await locks.acquire(key);
      });
      assert.equal(late!.signal.aborted, true);
    });

    it("a leader's fork that outlives its term is told when the term ends", async () => {
      const key = uniqueKey('leader');
      let forkSignal: AbortSignal | undefined;
      let release!: () => void;
      const held = new Promise<void>((resolve) => (release = resolve));
      let fork: Promise<void> | undefined;
      const started = new Promise<void>((resolve) => {
        const leadership = locks.lead(key, async () => {
          fork = locks.using(key, async (lock) => {
            forkSignal = lock.signal;
            resolve();
            await held;
          });
          await sleep(5);
          void leadership.stop();
        });
      });
      await started;
      assert.ok(await eventually(() => forkSignal!.aborted), "the fork's signal never aborted");
      release();
      await fork;
    });

    it('Promise.all of two calls nested in a nested section: one at a time, in the outer hold', async () => {
      reset();
      const key = uniqueKey('acct');
      await locks.using(key, async (outer) => {
        // Both forks are nested in a view of the hold: one enters it, the other waits its turn.
        await locks.using(key, () => Promise.all([debitWith(key, 10), debitWith(key, 20)]));
        assert.deepEqual(ledger.fences, [outer.fence, outer.fence], 'both ran in the outer hold');
      });
      assert.equal(ledger.balance, 70);
      assert.equal(ledger.mostInside, 1, 'two nested calls were inside at once');
    });

    it('straight nesting, any depth, never waits', async () => {
      const key = uniqueKey();
      // Every nested call with acquireTimeout 0: one that had to wait would throw
      // LockAcquireTimeoutError, whatever the machine's speed.
      const depth = async (n: number): Promise<number> =>
        n === 0
          ? getCurrentLock(key)!.fence
          : locks.using(key, () => depth(n - 1), { acquireTimeout: 0 });
      await locks.using(
        key,
        async (outer) => {
          assert.equal(await depth(5), outer.fence);
          // Sequential nested calls, each after the previous one ended.
          for (let i = 0; i < 3; i++) assert.equal(await depth(2), outer.fence);
        },
        { acquireTimeout: 0 },
      );
    });
  });

  describe('nested options the outer hold cannot honour', () => {
    it('another ttl, autoExtend or token is a LockArgumentError naming the option', async () => {
      const key = uniqueKey();
      await locks.using(
        key,
        async (outer) => {
          for (const [option, value] of [
            ['ttl', 5_000],
            ['autoExtend', true],
            ['token', 'someone-else'],
          ] as const) {
            await assert.rejects(
              locks.using(key, async () => assert.fail('ran'), { [option]: value }),
              (error) => error instanceof LockArgumentError && error.argument === option,
              option,
            );
          }
          // The same values, or none, re-enter.
          await locks.using(key, async (inner) => assert.equal(inner.fence, outer.fence), {
            ttl: 3_000,
            autoExtend: false,
            token: outer.token,
          });
          await locks.using(key, async (inner) => assert.equal(inner.fence, outer.fence));
        },
        { ttl: 3_000, autoExtend: false },
      );
    });

    it('another shape (limit, read or write, fair) or holdAtLeast is a LockArgumentError naming it; the same one re-enters', async () => {
      // Each with how the refusal names what the chain holds.
      const outers: [string, AcquireOptions, AcquireOptions[], string][] = [
        ['plain', {}, [{ limit: 2 }, { mode: 'read' }, { fair: true }], 'a plain lock'],
        ['semaphore', { limit: 2 }, [{}, { limit: 3 }, { mode: 'read' }], 'limit 2'],
        [
          'read',
          { mode: 'read' },
          [{}, { mode: 'write' }, { fair: true }, { limit: 2 }],
          'a read lock',
        ],
        ['fair', { fair: true }, [{}, { mode: 'read' }, { limit: 2 }], 'a fair lock'],
      ];
      for (const [name, shape, others, named] of outers) {
        const key = uniqueKey();
        await locks.using(
          key,
          async (outer) => {
            for (const other of others) {
              await assert.rejects(
                locks.using(key, async () => assert.fail('ran'), other),
                (error) =>
                  error instanceof LockArgumentError &&
                  error.argument === 'limit + mode + fair' &&
                  error.message.includes(`already holds "${key}" with ${named} (`),
                `${name} outer, nested ${JSON.stringify(other)}`,
              );
            }
            if (name === 'plain') {
              // (holdAtLeast is for plain locks only.) The outer one's (0) re-enters.
              await assert.rejects(
                locks.using(key, async () => assert.fail('ran'), { holdAtLeast: 10 }),
                (error) => error instanceof LockArgumentError && error.argument === 'holdAtLeast',
              );
              await locks.using(key, async (inner) => assert.equal(inner.fence, outer.fence), {
                holdAtLeast: 0,
              });
            }
            await locks.using(key, async (inner) => assert.equal(inner.fence, outer.fence), shape);
          },
          shape,
        );
      }
    });

    it('a call nested two deep (in a view) is checked as one nested once: the same options re-enter, others are refused', async () => {
      const key = uniqueKey();
      await locks.using(
        key,
        async (outer) => {
          await locks.using(key, async () => {
            for (const [option, value] of [
              ['ttl', 5_000],
              ['autoExtend', true],
              ['holdAtLeast', 10],
              ['token', 'someone-else'],
              ['limit + mode + fair', undefined],
            ] as const) {
              const options = value === undefined ? { limit: 2 } : { [option]: value };
              await assert.rejects(
                locks.using(key, async () => assert.fail('ran'), options),
                (error) =>
                  error instanceof LockArgumentError &&
                  error.argument === option &&
                  error.message.includes(key),
                option,
              );
            }
            const same = { ttl: 3_000, autoExtend: false, holdAtLeast: 0, token: outer.token };
            await locks.using(key, async (inner) => assert.equal(inner.fence, outer.fence), {
              ...same,
              acquireTimeout: 0,
            });
          });
        },
        { ttl: 3_000, autoExtend: false },
      );
    });

    it("a view is its LockService's own: release() and extend() take it, another LockService's refuse it", async () => {
      const other = await startLockModule({ connection: server.url });
      try {
        const key = uniqueKey();
        await locks.using(key, async (outer) => {
          const view = await locks.acquire(key);
          for (const call of [() => other.locks.release(view), () => other.locks.extend(view)]) {
            await assert.rejects(
              call(),
              (error) => error instanceof LockArgumentError && error.argument === 'lock',
            );
          }
          const before = outer.expiresAt;
          await locks.extend(view, 20_000);
          assert.ok(outer.expiresAt > before, 'the view did not extend the outer lock');
          assert.equal(await locks.release(view), true);
        });
      } finally {
        await other.close();
      }
    });

    it('several keys nested in a section that holds one of them, failing on another: the view taken is given back, and the next nested call re-enters at once', async () => {
      const other = await startLockModule({ connection: server.url });
      const [a, b] = [uniqueKey(), uniqueKey()].sort();
      const blocker = await other.locks.acquire(b);
      try {
        await locks.using(a, async (outer) => {
          await assert.rejects(
            locks.acquire([a, b], { acquireTimeout: 50 }),
            LockAcquireTimeoutError,
          );
          // Still inside the view of `a` the failed call took, this one would have to wait.
          await locks.using(a, async (inner) => assert.equal(inner.fence, outer.fence), {
            acquireTimeout: 0,
          });
        });
      } finally {
        await blocker.release();
        await other.close();
      }
    });

    it("a several-key fork's wait for its turn that times out reports one timeout event, the call's, not one for its key too (found by mutation testing)", async () => {
      const [a, b] = [uniqueKey(), uniqueKey()].sort();
      await locks.using([a, b], async () => {
        const inside = await locks.acquire([a, b]); // inside until released below
        const events: LockEvent[] = [];
        const subscription = locks.events.subscribe((event) => events.push(event));
        try {
          await assert.rejects(
            locks.acquire([a, b], { acquireTimeout: 50 }),
            (error) => error instanceof LockAcquireTimeoutError && error.key === a && error.busy,
          );
        } finally {
          subscription.unsubscribe();
        }
        assert.deepEqual(
          events.filter((event) => event.type === 'timeout').map((event) => event.key),
          [a],
        );
        assert.equal(await inside.release(), true);
      });
    });

    it("a hold lost while a view is inside: the view's signal aborts with the hold's reason, its release is false, its extend() and a re-entry throw it", async () => {
      const key = uniqueKey();
      await locks.using(
        key,
        async (outer) => {
          const view = await locks.acquire(key);
          await redis.del(`lock:{${key}}`); // lost behind the holder's back
          assert.ok(await eventually(() => outer.signal.aborted, 3_000), 'the hold never learnt');
          const reason = outer.signal.reason as LockLostError;
          assert.ok(reason instanceof LockLostError);
          assert.equal(view.signal.reason, reason);
          await assert.rejects(view.extend(), (error) => error === reason);
          assert.equal(await view.release(), false);
          assert.equal(view.signal.aborted, true, 'released, the view forgot why it ended');
          // The level free again, a re-entry meets the loss.
          await assert.rejects(
            locks.using(key, () => 'inner'),
            (error) => error === reason,
          );
        },
        { ttl: 2_000, autoExtend: true },
      );
    });

    it('at the outer end, a view still inside is told, and one that ended above it is not', async () => {
      const key = uniqueKey();
      let middle: Lock | undefined;
      let deeper: Lock | undefined;
      await locks.using(key, async () => {
        // A nested section (the middle view) whose own flow leaves a view open, one level down:
        // the section ends, the view below it stays inside.
        await locks.using(key, async (view) => {
          middle = view;
          void view.signal; // created while inside
          deeper = await locks.acquire(key);
          void deeper.signal;
        });
        assert.equal(middle!.signal.aborted, false);
      });
      assert.equal(deeper!.signal.aborted, true, 'the view still inside was not told');
      assert.equal(middle!.signal.aborted, false, 'the section that had ended was told');
    });

    it('a view reads the outer lock: key, keys, token, fences and lease, and extends it; one released before the outer end is not told of it', async () => {
      const [a, b] = [uniqueKey(), uniqueKey()].sort();
      for (const keys of [[a], [a, b]]) {
        let released: Lock | undefined;
        await locks.using(keys, async (outer) => {
          const view = await locks.acquire(keys);
          released = view;
          void view.signal; // created while inside
          assert.deepEqual(
            [view.key, view.keys, view.token, view.fence, view.fences, view.expiresAt],
            [outer.key, outer.keys, outer.token, outer.fence, outer.fences, outer.expiresAt],
          );
          const before = outer.expiresAt;
          await view.extend(20_000);
          assert.ok(outer.expiresAt > before, 'the view extended the outer lock');
          assert.equal(view.expiresAt, outer.expiresAt);
          assert.equal(await view.release(), true);
          await assert.rejects(view.extend(), LockLostError);
          assert.equal(await view.release(), false, 'a view is released once');
          assert.equal(outer.signal.aborted, false);
          assert.equal(await locks.isLocked(a), true, "the view's release freed the outer lock");
        });
        // Released before the outer end, the view was no longer inside: its signal says nothing.
        assert.equal(released!.signal.aborted, false, `${keys.length} key(s)`);
      }
    });

    it('an already-aborted signal rejects and does not run the nested work', async () => {
      const key = uniqueKey();
      await locks.using(key, async () => {
        await assert.rejects(
          locks.using(key, async () => assert.fail('ran'), { signal: AbortSignal.abort() }),
          (error) => error instanceof LockAcquireAbortedError,
        );
      });
    });
  });
});
