/**
 * The short chaos profile as a test suite for one deployment mode: one session of 4 worker
 * processes × 8 loops that goes through every fault scenario in turn, a phase each (see
 * `runPhases`), then shuts down. Each phase is a subtest with its own verdict. The spec files pick
 * the modes; `npm run chaos` runs the full profile (fresh servers and workers per scenario, 2 runs
 * of 30 s each).
 */
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { check, type ScenarioFigures } from './chaos-checker.js';
import { renderTable, violations } from './chaos-report.js';
import { PHASE_ORDER, PROFILES, runPhases, type Scenario } from './chaos-runner.js';
import { MODE_LABELS, type ChaosMode } from './chaos-topologies.js';

export function chaosSuite(mode: ChaosMode): void {
  describe(`chaos (short profile, ${MODE_LABELS[mode] || 'one Redis'})`, () => {
    it('every fault in turn, on one set of workers', async (t) => {
      const { phases, session } = await runPhases(PROFILES.short, mode);
      const figures = phases.map(check);
      const whole = check(session);
      console.log(`\n${renderTable([...figures, whole])}\n`);
      for (const [i, scenario] of PHASE_ORDER.entries()) {
        await t.test(scenario.name, () => assertPhase(scenario, figures[i]));
      }
      await t.test(
        'after every phase and the shutdown: nothing left, no stale write accepted, every call settled',
        () => assert.deepEqual(violations(whole), [], explain(whole)),
      );
    });
  });
}

function assertPhase(scenario: Scenario, figures: ScenarioFigures): void {
  const why = explain(figures);
  assert.deepEqual(violations(figures), [], why);
  if (scenario.control) {
    // Without faults nothing may go wrong at all: a lock that works never overlaps, and no call
    // fails unless the machine itself stood still (a CI host running other jobs beside this one
    // can starve the runner, whose proxies carry every lock's traffic).
    assert.equal(figures.overlaps, 0, `overlaps without a fault\n${why}`);
    assert.equal(figures.calls.failed - figures.failedStarved, 0, `calls failed unstarved\n${why}`);
    assert.equal(
      figures.signals - figures.signalsExcused,
      0,
      `signals raised unstarved without a fault\n${why}`,
    );
  } else {
    assert.ok(figures.faults > 0, 'the fault was injected');
  }
  // A fault that only delays or cuts off a live holder never lets two holders believe at once:
  // the holder's own TTL clock starts before Redis's, so it stops first.
  if (!scenario.overlapPossible) assert.equal(figures.overlaps, 0, `no overlap\n${why}`);
}

/** A failed assertion's message: the violations, what went wrong and what calls ended in. */
function explain(figures: ScenarioFigures): string {
  return [
    `${figures.name}: ${violations(figures).join(', ') || 'no violation'}`,
    ...figures.notes,
    ...figures.callDetails,
  ].join('\n');
}
