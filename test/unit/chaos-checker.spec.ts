/** The chaos checker on made-up histories: each figure it reports can go above 0. */
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import {
  check,
  emptyRecord,
  percentile,
  type Call,
  type ScenarioRecord,
  type Section,
} from '../chaos/chaos-checker.js';
import { violations } from '../chaos/chaos-report.js';

function record(sections: Partial<Section>[], extra: Partial<ScenarioRecord> = {}): ScenarioRecord {
  return {
    ...emptyRecord('made up', false, 1),
    sections: sections.map((s, i) => ({
      id: String(i),
      key: 'k',
      fence: i + 1,
      path: 'using',
      enter: i * 100,
      exit: i * 100 + 50,
      ...s,
    })),
    calls: [call('ok')],
    accepted: new Map([['k', sections.map((_, i) => i + 1)]]),
    end: 10_000,
    ...extra,
  };
}

function call(outcome: string, starved = false): Call {
  return { path: 'using', outcome, start: 0, ms: 1, unsettled: false, starved };
}

describe('chaos checker', () => {
  it('a clean sequential history has no violation', () => {
    const figures = check(record([{}, {}, {}]));
    assert.equal(figures.overlaps, 0);
    assert.equal(figures.fenceRegressions, 0);
    assert.deepEqual(violations(figures), []);
  });

  it('counts an overlap, and a lost holder that never saw its signal', () => {
    const figures = check(
      record([
        { enter: 0, exit: 200 },
        { enter: 100, exit: 150 },
      ]),
    );
    assert.equal(figures.overlaps, 1);
    assert.equal(figures.lost, 1);
    assert.equal(figures.lostUnsignalled, 1);
    assert.ok(violations(figures).some((v) => v.includes('signal never fired')));
    // Where Redis loses its state, that is a figure, not a violation.
    assert.deepEqual(
      violations(check(record([{ enter: 0, exit: 200 }, { enter: 100 }], { losesState: true }))),
      [],
    );
  });

  it('a section entered with its signal already aborted is neither an overlap nor a fence regression', () => {
    // Paused between its grant (fence 1) and its section, past its lease, while fence 2 entered.
    const figures = check(
      record([
        { fence: 2, enter: 0, exit: 200 },
        { fence: 1, enter: 100, exit: 100, abortAt: 100 },
      ]),
    );
    assert.equal(figures.overlaps, 0);
    assert.equal(figures.fenceRegressions, 0);
    assert.equal(figures.lostUnsignalled, 0);
    // Without the abort at entry, the same history is both.
    const believing = check(
      record([
        { fence: 2, enter: 0, exit: 200 },
        { fence: 1, enter: 100, exit: 150 },
      ]),
    );
    assert.equal(believing.overlaps, 1);
    assert.equal(believing.fenceRegressions, 1);
  });

  it('a holder stops believing when its signal aborts: no overlap after it, a delay before it', () => {
    assert.equal(check(record([{ enter: 0, exit: 200, abortAt: 90 }, { enter: 100 }])).overlaps, 0);
    const late = check(record([{ enter: 0, exit: 200, abortAt: 130 }, { enter: 100 }]));
    assert.equal(late.overlaps, 1);
    assert.equal(late.lostUnsignalled, 0);
    assert.equal(late.signalDelay.p50, 30);
  });

  it("a holder starved past its own lease's end: the overlap is counted apart; unstarved, or its lease not over, it is an overlap", () => {
    const holder = { enter: 0, exit: 200, abortAt: 130 };
    const starved = check(record([{ ...holder, starved: true, leaseEnd: 90 }, { enter: 100 }]));
    assert.deepEqual([starved.overlaps, starved.overlapsStarved], [0, 1]);
    assert.equal(starved.lost, 1); // still lost, and signalled late: the delay is measured
    for (const other of [
      { ...holder, starved: false, leaseEnd: 90 },
      { ...holder, starved: true, leaseEnd: 110 },
      { ...holder, starved: true },
    ]) {
      const figures = check(record([other, { enter: 100 }]));
      assert.deepEqual([figures.overlaps, figures.overlapsStarved], [1, 0], JSON.stringify(other));
    }
  });

  it("a holder whose signal came after its own lease's end by no more than its process stood still: the overlap is counted apart; later than that, or its lease not over, it is an overlap", () => {
    // Lease over at 90, the other entered at 100, the signal at 130: 40 ms late.
    const holder = { enter: 0, exit: 200, abortAt: 130, starved: false, leaseEnd: 90 };
    const late = check(record([{ ...holder, stall: 45 }, { enter: 100 }]));
    assert.deepEqual([late.overlaps, late.overlapsStarved], [0, 1]);
    for (const other of [
      { ...holder, stall: 35 }, // later than the loop stood still: the library's own delay
      { ...holder, stall: 45, leaseEnd: 110 }, // its lease not over when the other entered
      { ...holder }, // nothing measured
    ]) {
      const figures = check(record([other, { enter: 100 }]));
      assert.deepEqual([figures.overlaps, figures.overlapsStarved], [1, 0], JSON.stringify(other));
    }
  });

  it('a killed holder believes until the kill and is not counted as lost', () => {
    assert.equal(
      check(record([{ enter: 0, exit: undefined, killedAt: 90 }, { enter: 100 }])).overlaps,
      0,
    );
    const figures = check(record([{ enter: 0, exit: undefined, killedAt: 120 }, { enter: 100 }]));
    assert.equal(figures.overlaps, 1);
    assert.equal(figures.lost, 0);
  });

  it('a section without exit or kill believes until the end of the scenario', () => {
    assert.equal(check(record([{ enter: 0, exit: undefined }, { enter: 5_000 }])).overlaps, 1);
  });

  it('counts fence regressions (equal fences included) per key, in order of entry', () => {
    const figures = check(
      record([{ fence: 5 }, { fence: 5 }, { fence: 4 }, { fence: 9 }, { key: 'other', fence: 1 }]),
    );
    assert.equal(figures.fenceRegressions, 2);
    assert.ok(violations(figures).some((v) => v.includes('fence regressions')));
  });

  it('sections of one hold (re-entered, forked) share its fence one after another; overlapping, they count', () => {
    const turns = check(
      record([
        { fence: 5, hold: 'a' },
        { fence: 5, hold: 'a' },
        { fence: 5, hold: 'b' },
        { fence: 6, hold: 'c' },
      ]),
    );
    assert.equal(turns.fenceRegressions, 1, 'only the other hold with an equal fence');
    assert.equal(turns.overlaps, 0);
    const together = check(
      record([
        { fence: 5, hold: 'a', enter: 0, exit: 50 },
        { fence: 5, hold: 'a', enter: 10, exit: 60 },
      ]),
    );
    assert.equal(together.overlaps, 1, 'two sections of one hold inside at once');
  });

  it("a frozen holder's later section of its hold, entered after a newer hold's: an overlap, not a fence regression, and the newer holder is not lost", () => {
    // A leader's term (hold a, fence 1) runs section after section; frozen, it loses the lock to
    // b (fence 2) and, thawed, enters one more section before its expiry timer fires.
    const figures = check(
      record([
        { fence: 1, hold: 'a', enter: 0, exit: 50 },
        { fence: 1, hold: 'a', enter: 50, exit: 150, abortAt: 120 },
        { fence: 2, hold: 'b', enter: 100, exit: 300 },
        { fence: 1, hold: 'a', enter: 200, exit: 210, abortAt: 205 },
      ]),
    );
    assert.equal(figures.overlaps, 2);
    assert.equal(figures.fenceRegressions, 0);
    assert.equal(figures.lost, 1, 'the frozen holder');
    assert.equal(figures.lostUnsignalled, 0);
    // A new hold granted that fence after b's would be a regression.
    const granted = check(
      record([
        { fence: 2, hold: 'b', enter: 100, exit: 300 },
        { fence: 1, hold: 'c', enter: 200, exit: 210 },
      ]),
    );
    assert.equal(granted.fenceRegressions, 1);
  });

  it("a hold's signal that fires in its next section tells the section before it too", () => {
    // A frozen leader thaws and finishes its section before its overdue timers run; the abort
    // comes in its next section.
    const figures = check(
      record([
        { fence: 1, hold: 'a', enter: 0, exit: 300 },
        { fence: 2, hold: 'b', enter: 100, exit: 400 },
        { fence: 1, hold: 'a', enter: 300, exit: 320, abortAt: 310 },
      ]),
    );
    assert.equal(figures.lost, 1);
    assert.equal(figures.lostUnsignalled, 0);
    assert.equal(figures.signalDelay.p50, 210);
  });

  it('semaphore places: each admitted while fewer than its own limit hold the key', () => {
    const places = (limits: number[], fences = limits.map((_, i) => i + 1)): ScenarioRecord =>
      record(
        limits.map((limit, i) => ({
          shape: { limit },
          fence: fences[i],
          enter: i * 10,
          exit: 500,
        })),
      );
    // Two in, a caller with limit 3 joins: fine; a third with limit 3 then: fine.
    assert.equal(check(places([3, 3, 3])).overlaps, 0);
    assert.equal(check(places([2, 3, 3])).overlaps, 0);
    // Two in, a caller with limit 2 joins: one too many for its limit.
    const over = check(places([3, 3, 2]));
    assert.equal(over.overlaps, 1);
    assert.equal(over.lost, 1, 'the oldest place is the one taken');
    // Places are granted side by side: fences entering out of order are no regression.
    assert.equal(check(places([3, 3, 3], [2, 1, 3])).fenceRegressions, 0);
    // A limit-2 place granted first (fence 1) whose reply came back late enters beside two places
    // of limit 3 granted after it (seen in the chaos control phase on a Cluster): each was admitted
    // while fewer than its own limit held the key.
    assert.equal(check(places([3, 3, 2], [2, 3, 1])).overlaps, 0);
    // The same late entry when it was granted last is one too many for its limit.
    assert.equal(check(places([3, 3, 2], [1, 2, 3])).overlaps, 1);
  });

  it('read and write locks: readers side by side, a writer alone, fences above every writer', () => {
    const history = (...sections: Partial<Section>[]): ScenarioRecord =>
      record(sections.map((s, i) => ({ enter: i * 10, exit: 500, ...s })));
    const readers = check(history({ shape: 'read', fence: 2 }, { shape: 'read', fence: 1 }));
    assert.equal(readers.overlaps, 0);
    assert.equal(readers.fenceRegressions, 0, 'readers granted side by side enter in any order');
    assert.equal(check(history({ shape: 'read' }, { shape: 'write' })).overlaps, 1);
    assert.equal(check(history({ shape: 'write' }, { shape: 'read' })).overlaps, 1);
    assert.equal(check(history({ shape: 'write' }, { shape: 'write' })).overlaps, 1);
    const after = (fence: number): number =>
      check(
        history(
          { shape: 'write', fence: 5, exit: 5 },
          { shape: 'read', fence: 6, exit: 15 },
          { shape: 'read', fence },
        ),
      ).fenceRegressions;
    assert.equal(after(5), 1, "a reader's fence is above the last writer's");
    assert.equal(after(6), 0, "not above another reader's");
    assert.equal(
      check(history({ shape: 'read', fence: 7, exit: 5 }, { shape: 'write', fence: 7 }))
        .fenceRegressions,
      1,
      "a writer's fence is above every earlier grant's",
    );
  });

  it('counts stale writes the guard accepted', () => {
    const figures = check(record([{}], { accepted: new Map([['k', [5, 7, 6, 7, 3]]]) }));
    assert.equal(figures.staleAccepted, 2);
  });

  it('every must-be-zero figure makes a violation', () => {
    const figures = check(
      record([{}], {
        leftoverLocks: 1,
        keysWithoutTtl: 1,
        unhandled: 1,
        crashes: 1,
        unsettledShutdowns: 1,
        calls: [{ ...call('fetch TypeError'), unsettled: true }],
      }),
    );
    assert.equal(figures.unsettled, 2);
    assert.equal(figures.calls.other, 1);
    assert.equal(violations(figures).length, 6);
    assert.ok(violations(check(record([]))).some((v) => v.includes('no critical section')));
  });

  it('counts the failed calls during which the machine was starved', () => {
    const calls = [
      call('ok', true),
      call('LockLostError', true),
      call('LockBackendError'),
      call('http 500', true),
      call('LockAcquireTimeoutError', true),
    ];
    const figures = check(record([{}], { calls }));
    assert.deepEqual(figures.calls, { ok: 1, busy: 1, failed: 3, other: 0 });
    assert.equal(figures.failedStarved, 2);
  });

  it('counts the signals that aborted while the machine was starved or after the phase, and notes the others', () => {
    const figures = check(
      record([
        { abortAt: 40 },
        { abortAt: 140, starved: true },
        {},
        { abortAt: 320 },
        { abortAt: 450, signalLater: true },
      ]),
    );
    assert.equal(figures.signals, 4);
    assert.equal(figures.signalsExcused, 2);
    assert.deepEqual(
      figures.notes.filter((n) => n.startsWith('signalled unstarved')).length,
      2,
      figures.notes.join('\n'),
    );
  });

  it("a phase counts overlaps and fence regressions against an earlier phase's holder, not that holder itself", () => {
    // Phase 2 begins at 1,000. Section 0 (phase 1) still believes then (until 1,500); section 1
    // (phase 1, over) is not context. Section 2 enters on 0 with a lower fence than 0's.
    const figures = check(
      record([
        { enter: 900, exit: 1_500, fence: 7, context: true },
        { enter: 950, exit: 1_100, fence: 6, context: true },
        { enter: 1_200, exit: 1_300, fence: 5 },
        { enter: 1_600, exit: 1_700, fence: 8 },
      ]),
    );
    // The context sections' own overlap (1 entered while 0 believed) and regression (6 after 7)
    // belong to their phase; this phase's section 2 overlaps 0 and regresses below 7.
    assert.equal(figures.sections, 2);
    assert.equal(figures.overlaps, 1);
    assert.equal(figures.fenceRegressions, 1);
    // A section with a lower fence does not supersede 0: the regression is what went wrong.
    assert.equal(figures.lost, 0);
  });

  it('percentiles', () => {
    assert.equal(percentile([], 50), 0);
    assert.equal(percentile([3, 1, 2], 50), 2);
    assert.equal(percentile([...Array(100).keys()], 99), 98);
  });
});
