/**
 * The short chaos profile, in `npm test`: every fault scenario for a few seconds with 4 worker
 * processes × 8 loops, on one Redis and in Redlock mode on three (where Redis faults hit one node).
 * The full profile (`npm run chaos`) writes the committed report.
 */
import assert from 'node:assert/strict';
import { after, describe, it } from 'node:test';
import { check, type ScenarioFigures } from './chaos-checker.js';
import { renderTable, violations } from './chaos-report.js';
import { PROFILES, runScenario, SCENARIOS } from './chaos-runner.js';

for (const mode of ['standalone', 'redlock'] as const) {
  describe(`chaos (short profile, ${mode === 'redlock' ? 'Redlock on 3 nodes' : 'one Redis'})`, () => {
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
          // Without faults nothing may go wrong at all: a lock that works never overlaps.
          assert.equal(figures.overlaps, 0);
          assert.equal(figures.calls.failed, 0);
          assert.equal(figures.signals, 0);
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
