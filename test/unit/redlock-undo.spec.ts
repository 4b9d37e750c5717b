/**
 * Redlock's undo of failed attempts, as pure logic over stand-in nodes whose replies the test
 * releases one by one. The bug it pins down: a waiter retries with the same token; a node's late
 * "granted" reply to its failed first attempt used to release that node's copy even though the
 * second attempt had re-taken it (by re-entry) and won, so the lock stood on fewer nodes than a
 * majority and another process got it too (seen as a lost update in the cross-process test).
 */
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { Logger } from '@nestjs/common';
import type { Redis } from 'ioredis';
import { LockQuorumError } from '../../lib/errors/redis-lock.errors.js';
import type { AcquireAttempt, Freed } from '../../lib/interfaces/lock-backend.interface.js';
import type { RedisLockBackend } from '../../lib/redis/redis-lock.backend.js';
import { RedlockBackend } from '../../lib/redis/redlock.backend.js';
import { assertWithin, watchStalls } from '../support/timing.js';

/** A node whose acquisition replies the test hands out; it records releases. */
class StandInNode {
  readonly pending: ((reply: AcquireAttempt) => void)[] = [];
  releases = 0;
  raises = 0;
  /** The fence floor each attempt proposed (the 7th argument; undefined for a caller's token). */
  readonly floors: (number | undefined)[] = [];
  tryAcquire(...args: unknown[]): Promise<AcquireAttempt> {
    this.floors.push(args[6] as number | undefined);
    return new Promise((resolve) => this.pending.push(resolve));
  }
  /** The fence each undo passed (a caller's own token), or undefined (a generated one). */
  readonly undone: (number | undefined)[] = [];
  undoCopy(_key: string, _token: string, _message: unknown, fence?: number): Promise<boolean> {
    this.releases++;
    this.undone.push(fence);
    return Promise.resolve(true);
  }
  raiseFence(): Promise<boolean> {
    this.raises++;
    return Promise.resolve(true);
  }
}

const granted: AcquireAttempt = { acquired: true, fence: 7, validity: 10_000 };
const held: AcquireAttempt = { acquired: false, retryAfter: 100, held: true };
const settle = (): Promise<void> => new Promise((resolve) => setImmediate(resolve));

function redlock(nodes: StandInNode[]): RedlockBackend {
  return new RedlockBackend(
    nodes as unknown as RedisLockBackend[],
    [] as Redis[],
    0.01,
    1_000,
    new Logger('test'),
  );
}

describe('Redlock undo of a failed attempt (a generated token, which a waiter reuses for its retries)', () => {
  it('releases a copy granted late when no later attempt was made', async () => {
    const nodes = [0, 1, 2].map(() => new StandInNode());
    const backend = redlock(nodes);
    const first = backend.tryAcquire('k', 't', 10_000, undefined, undefined, true);
    nodes[0].pending[0](held);
    nodes[1].pending[0](held);
    assert.equal((await first).acquired, false);
    nodes[2].pending[0](granted); // late: the attempt was already given up
    await settle();
    assert.equal(nodes[2].releases, 1);
  });

  it('leaves a late-granted copy to the later attempt with the same token that re-took it', async () => {
    const nodes = [0, 1, 2].map(() => new StandInNode());
    const backend = redlock(nodes);
    const first = backend.tryAcquire('k', 't', 10_000, undefined, undefined, true);
    nodes[0].pending[0](held);
    nodes[1].pending[0](held);
    assert.equal((await first).acquired, false);
    // The waiter tries again (same token) before node 2 answered the first attempt.
    const second = backend.tryAcquire('k', 't', 10_000, undefined, undefined, true);
    nodes[2].pending[0](granted); // late answer to the first attempt
    nodes[0].pending[1](granted);
    nodes[2].pending[1](granted); // re-entry: the same copy
    assert.equal((await second).acquired, true);
    nodes[1].pending[1](held);
    await settle();
    assert.deepEqual(
      nodes.map((node) => node.releases),
      [0, 0, 0],
      'nothing of the held lock is released',
    );
  });
});

describe("Redlock fence of a caller's own token held on a majority (holderFence)", () => {
  const own = (fence: number, settled: boolean): AcquireAttempt => ({
    acquired: true,
    fence,
    validity: 10_000,
    renewed: true,
    settled,
  });

  it('is the highest settled record where a majority answers one, not a record a node wrote at its own grant, nor the lowest; it waits for every answer to know', async () => {
    const nodes = [0, 1, 2, 3, 4].map(() => new StandInNode());
    const backend = redlock(nodes);
    const acquired = backend.tryAcquire('k', 'mine', 10_000);
    nodes[0].pending[0](own(10, true));
    nodes[1].pending[0](own(12, false)); // its own grant's count, not settled yet
    nodes[2].pending[0](own(11, true));
    nodes[3].pending[0](own(11, true));
    let decided = false;
    void acquired.then(() => (decided = true));
    await settle();
    assert.equal(decided, false, 'decided on two settled records of five');
    nodes[4].pending[0](held);
    const attempt = await acquired;
    assert.equal(attempt.acquired, true);
    assert.equal(attempt.acquired && attempt.fence, 11);
  });

  it('is the highest record where fewer than a majority answer a settled one: a provisional one may be a sibling’s first acquisition, counted after a holder the settled record predates (found by a helper’s script)', async () => {
    const nodes = [0, 1, 2].map(() => new StandInNode());
    const backend = redlock(nodes);
    const acquired = backend.tryAcquire('k', 'mine', 10_000);
    nodes[0].pending[0](own(10, true)); // a copy a paused node kept
    nodes[1].pending[0](own(12, false)); // a sibling's grant, after another holder's 11
    nodes[2].pending[0](held);
    const attempt = await acquired;
    assert.equal(attempt.acquired && attempt.fence, 12);
  });

  it('is the highest the majority answered when none of them is settled yet', async () => {
    const nodes = [0, 1, 2].map(() => new StandInNode());
    const backend = redlock(nodes);
    const acquired = backend.tryAcquire('k', 'mine', 10_000);
    nodes[0].pending[0](own(10, false));
    nodes[1].pending[0](own(12, false));
    const attempt = await acquired;
    nodes[2].pending[0](held);
    await settle();
    assert.equal(attempt.acquired && attempt.fence, 12);
  });
});

/**
 * A node for `forceRelease()`: it frees the key with `fence` as its counter's value, and answers
 * the force's second round (raising its counter to the highest fence) with `raises`: yes, no, or
 * never. Its releases of the force's own hold are counted.
 */
class ForcedNode {
  releases = 0;
  raised = 0;
  constructor(
    private readonly fence: number,
    private readonly raises: boolean | 'never',
  ) {}
  forceRelease(): Promise<Freed> {
    return Promise.resolve({ mode: 'exclusive', holders: 1, fence: this.fence });
  }
  raiseFence(): Promise<boolean> {
    this.raised++;
    return this.raises === 'never' ? new Promise(() => {}) : Promise.resolve(this.raises);
  }
  release(): Promise<boolean> {
    this.releases++;
    return Promise.resolve(true);
  }
}

describe('Redlock forceRelease whose nodes counted different fences', () => {
  // The highest fence (30) is on two nodes of five: the force raises the others' counters to it.
  const fences = [30, 30, 10, 10, 5];

  it('frees the key when a majority raises its counter (3 of 5), with the highest fence', async () => {
    const nodes = fences.map(
      (fence, i) => new ForcedNode(fence, i !== 0 && i !== 1 ? true : false),
    );
    const freed = await redlock(nodes as never).forceRelease('k');
    assert.deepEqual(freed, { mode: 'exclusive', holders: 1, fence: 30 });
    assert.deepEqual(
      nodes.map((node) => node.raised),
      [1, 1, 1, 1, 1],
    );
  });

  it('sends no second round where a majority already counted the highest fence (found by mutation testing)', async () => {
    const nodes = [30, 30, 30, 10, 5].map((fence) => new ForcedNode(fence, true));
    const freed = await redlock(nodes as never).forceRelease('k');
    assert.deepEqual(freed, { mode: 'exclusive', holders: 1, fence: 30 });
    assert.deepEqual(
      nodes.map((node) => node.raised),
      [0, 0, 0, 0, 0],
    );
  });

  for (const refusal of [false, 'never'] as const) {
    it(`fails with LockQuorumError when a majority ${refusal === false ? 'refuses' : 'never answers'} the raise, and still releases its own hold (found by mutation testing)`, async () => {
      // Two raise (the two that counted 30 have nothing to raise but answer yes), three do not:
      // a fence below 30 could then be handed out by a majority, so nothing may be reported freed.
      const nodes = fences.map((fence, i) => new ForcedNode(fence, i < 2 ? true : refusal));
      const watch = watchStalls();
      const started = performance.now();
      // The reply bound's timer does not hold the process open (a client's socket does, which
      // stand-in nodes have not): this one does, until the call is over.
      const open = setTimeout(() => {}, 10_000);
      const error = await redlock(nodes as never)
        .forceRelease('k')
        .then(
          () => undefined,
          (e: unknown) => e,
        );
      clearTimeout(open);
      assert.ok(error instanceof LockQuorumError, String(error));
      assert.equal(error.timedOut, refusal === 'never');
      // Unanswered nodes are waited for at most the reply bound (commandTimeout 1 s here).
      const took = performance.now() - started;
      assertWithin(took, refusal === 'never' ? 1_000 : 0, watch, 'a force whose raise failed');
      watch.stop();
      await settle();
      assert.deepEqual(
        nodes.map((node) => node.releases),
        [1, 1, 1, 1, 1],
        "the force's own hold is released on every node",
      );
    });
  }
});

describe("Redlock's documented bounds (README: driftFactor; topologies: Redlock nodes)", () => {
  it('a grant is valid for ttl − ttl × driftFactor − 2 ms from when its attempt was sent (found by mutation testing)', async () => {
    for (const ttl of [1_000, 10_000]) {
      const nodes = [0, 1, 2].map(() => new StandInNode());
      const acquired = redlock(nodes).tryAcquire('k', 't', ttl);
      for (const node of nodes) node.pending[0](granted);
      const attempt = await acquired;
      assert.equal(attempt.acquired && attempt.validity, ttl - ttl * 0.01 - 2);
    }
  });

  it('a call waits for its two rounds at most 2 × commandTimeout + 100 ms (found by mutation testing)', () => {
    // The engine bounds every Redlock reply by this (its deadline for one server is commandTimeout).
    assert.equal(redlock([0, 1, 2].map(() => new StandInNode())).replyTimeout, 2 * 1_000 + 100);
  });
});

describe('Redlock acquisition of a generated token: a second round only where the majority disagrees', () => {
  /** Each node's grant, with the fence its counter gave; the raises each node was sent. */
  const raisesFor = async (fences: number[]): Promise<number[]> => {
    const nodes = fences.map(() => new StandInNode());
    const acquired = redlock(nodes).tryAcquire('k', 't', 10_000, undefined, undefined, true);
    nodes.forEach((node, i) =>
      node.pending[0]({ acquired: true, fence: fences[i], validity: 10_000 }),
    );
    const attempt = await acquired;
    await settle();
    assert.equal(attempt.acquired && attempt.fence, Math.max(...fences.slice(0, 2)));
    return nodes.map((node) => node.raises);
  };

  it('one round when every node, or a bare majority, gave the same fence: its counters are already there (found by mutation testing)', async () => {
    assert.deepEqual(await raisesFor([7, 7, 7]), [0, 0, 0]);
    assert.deepEqual(await raisesFor([7, 7, 5]), [0, 0, 0]);
  });

  it("a second round, to every node, where the majority's fences differ: their counters are raised to the highest", async () => {
    assert.deepEqual(await raisesFor([7, 8, 5]), [1, 1, 1]);
  });

  it("proposes a fence floor: this process's clock in µs, plus the lead the nodes' fences showed over it (+ 2 ms); a lead never shrinks; a caller's own token proposes none", async () => {
    const nodes = [0, 1, 2].map(() => new StandInNode());
    const backend = redlock(nodes);
    const clockUs = (): number => (performance.timeOrigin + performance.now()) * 1_000;
    /** One attempt whose nodes answer `answer(floor)`: the floor it proposed, less the clock. */
    const attempt = async (answer: (floor: number) => number): Promise<number> => {
      const before = clockUs();
      const acquired = backend.tryAcquire('k', 't', 10_000, undefined, undefined, true);
      const floor = nodes[0].floors.at(-1)!;
      assert.ok(
        nodes.every((node) => node.floors.at(-1) === floor),
        'one floor to every node',
      );
      for (const node of nodes) {
        node.pending.shift()!({ acquired: true, fence: answer(floor), validity: 10_000 });
      }
      await acquired;
      await settle();
      return floor - before;
    };
    // At first, the clock itself; every node answers it: nothing learned.
    const first = await attempt((floor) => floor);
    assert.ok(Math.abs(first) < 50_000, `the first floor ${first} µs off the clock`);
    // The nodes answer above it, all alike (no second round), and the lead is learned.
    const second = await attempt((floor) => floor + 1e9); // the nodes' clocks 1,000 s ahead
    assert.ok(Math.abs(second) < 50_000, `the second floor ${second} µs off the clock`);
    assert.deepEqual(
      nodes.map((node) => node.raises),
      [0, 0, 0],
    );
    // The next floor is that far ahead, with the margin: the nodes answer it, and agree.
    const third = await attempt((floor) => floor);
    assert.ok(third >= 1e9 + 2_000 && third < 1e9 + 60_000, `the third floor's lead ${third} µs`);
    // Answered below it (another process's floor lower), the lead stays.
    const fourth = await attempt((floor) => floor - 5e8);
    assert.ok(
      fourth >= 1e9 + 2_000 && fourth < 1e9 + 60_000,
      `the fourth floor's lead ${fourth} µs`,
    );
    // A caller's own token: its fence is its record's, no floor.
    const own = backend.tryAcquire('k', 'mine', 10_000);
    assert.deepEqual(
      nodes.map((node) => node.floors.at(-1)),
      [undefined, undefined, undefined],
    );
    for (const node of nodes) node.pending.shift()!(granted);
    await own;
  });
});

describe('Redlock term record (recordTerm)', () => {
  /** A node with no leader recorded yet: it notes what each read of its record asked for. */
  class RecordNode {
    readonly reads: boolean[] = [];
    records = 0;
    election(_key: string, participants: boolean): Promise<unknown> {
      this.reads.push(participants);
      return Promise.resolve({ leader: null, transitions: 0, participants: [] });
    }
    recordTerm(): Promise<void> {
      this.records++;
      return Promise.resolve();
    }
  }

  it("reads the majority's record without its participants, which it does not need, then writes on every node (found by mutation testing)", async () => {
    const nodes = [0, 1, 2].map(() => new RecordNode());
    await redlock(nodes as never).recordTerm('k', 't', 'me', 7, 10_000);
    assert.deepEqual(
      nodes.map((node) => [node.reads, node.records]),
      [
        [[false], 1],
        [[false], 1],
        [[false], 1],
      ],
    );
  });
});

describe("Redlock attempt of a caller's own token that fails", () => {
  it('undoes the copies it wrote, each only while the provisional record of its grant is there (its fence passed along), and none the token held already', async () => {
    const nodes = [0, 1, 2, 3, 4].map(() => new StandInNode());
    const first = redlock(nodes).tryAcquire('k', 'mine', 10_000);
    nodes[0].pending[0](held);
    nodes[1].pending[0](held);
    nodes[2].pending[0](held);
    assert.equal((await first).acquired, false);
    nodes[3].pending[0](granted); // written by this attempt: its record reads ~7
    nodes[4].pending[0]({ ...granted, renewed: true, settled: true }); // the token's already
    await settle();
    assert.deepEqual(
      nodes.map((node) => node.undone),
      [[], [], [], [7], []],
    );
  });
});
