/**
 * The short chaos profile as a test suite for one deployment mode: every fault scenario for a few
 * seconds with 4 worker processes × 8 loops. The spec files pick the modes (two files, so that
 * node's runner can run them side by side); `npm run chaos` runs the full profile.
 */
import assert from 'node:assert/strict';
import { after, describe, it } from 'node:test';
import { check, type ScenarioFigures } from './chaos-checker.js';
import { renderTable, violations } from './chaos-report.js';
import { PROFILES, runScenario, SCENARIOS } from './chaos-runner.js';
import { MODE_LABELS, type ChaosMode } from './chaos-topologies.js';

export function chaosSuite(mode: ChaosMode): void {
  describe(`chaos (short profile, ${MODE_LABELS[mode] || 'one Redis'})`, () => {
    const results: ScenarioFigures[] = [];
    after(() => {
      if (results.length) console.log(`\n${renderTable(results)}\n`);
    });

    for (const scenario of SCENARIOS) {
      it(scenario.name, async () => {
        const figures = check(await runScenario(scenario, PROFILES.short, mode));
        results.push(figures);
        assert.deepEqual(violations(figures), []);
        if (scenario.control) {
          // Without faults nothing may go wrong at all: a lock that works never overlaps, and no
          // call fails unless the machine itself stood still (a CI host running other suites
          // beside this one can starve the runner, whose proxies carry every lock's traffic).
          assert.equal(figures.overlaps, 0);
          assert.equal(figures.calls.failed - figures.failedStarved, 0, 'a call failed unstarved');
          if (figures.failedStarved === 0) assert.equal(figures.signals, 0);
        } else {
          assert.ok(figures.faults > 0, 'the fault was injected');
        }
        // A fault that only delays or cuts off a live holder never lets two holders believe at
        // once: the holder's own TTL clock starts before Redis's, so it stops first.
        if (!scenario.overlapPossible) assert.equal(figures.overlaps, 0, 'no overlap');
      });
    }
  });
}
