/**
 * `npm run chaos`: every fault scenario with the full profile, on one Redis and in Redlock mode;
 * prints the table and writes the report. Options: --profile short|full, --mode
 * standalone|redlock|all (default all), --only <text in a scenario name>, --report <path>
 * (default test/chaos/REPORT.md; `-` for none). Exits 1 when any scenario has a violation.
 */
import { writeFileSync } from 'node:fs';
import { parseArgs } from 'node:util';
import { check, type ScenarioFigures } from './chaos-checker.js';
import { renderReport, renderTable, violations } from './chaos-report.js';
import { PROFILES, runScenario, SCENARIOS, type ChaosMode } from './chaos-runner.js';

const { values } = parseArgs({
  options: {
    profile: { type: 'string', default: 'full' },
    mode: { type: 'string', default: 'all' },
    only: { type: 'string' },
    report: { type: 'string', default: 'test/chaos/REPORT.md' },
  },
});
const profile = PROFILES[values.profile as keyof typeof PROFILES];
if (!profile) throw new Error(`unknown profile ${values.profile}; use short or full`);
const scenarios = SCENARIOS.filter(
  (s) => values.only === undefined || s.name.includes(values.only),
);

const modes: ChaosMode[] =
  values.mode === 'all' ? ['standalone', 'redlock'] : [values.mode as ChaosMode];
if (!modes.every((mode) => mode === 'standalone' || mode === 'redlock')) {
  throw new Error(`unknown mode ${values.mode}; use standalone, redlock or all`);
}

const started = performance.now();
const results: ScenarioFigures[] = [];
for (const mode of modes) {
  for (const scenario of scenarios) {
    const figures = check(await runScenario(scenario, profile, mode));
    results.push(figures);
    const problems = violations(figures);
    console.log(
      `${problems.length ? '✖' : '✔'} ${figures.name}${problems.length ? `: ${problems.join(', ')}` : ''}`,
    );
  }
}
console.log(`\n${renderTable(results)}\n`);
if (values.report !== '-') {
  writeFileSync(
    values.report,
    renderReport(profile, results, (performance.now() - started) / 1000),
  );
  console.log(`report written to ${values.report}`);
}
process.exitCode = results.some((r) => violations(r).length > 0) ? 1 : 0;
