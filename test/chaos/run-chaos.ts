/**
 * `npm run chaos`: every fault scenario with the full profile, on one Redis, in Redlock mode, on a
 * Cluster and through Sentinel; prints the table and writes the report. Options: --profile
 * short|full (short: one session per deployment going through every scenario in turn, as in
 * `npm test`), --mode standalone|redlock|cluster|sentinel|all (default all), --only <text in a
 * scenario name> (full profile), --report <path>
 * (default test/chaos/REPORT.md; `-` for none). Exits 1 when any scenario has a violation.
 */
import { parseArgs } from 'node:util';
import { writeMarkdown } from '../support/markdown.js';
import { check, type ScenarioFigures } from './chaos-checker.js';
import { renderReport, renderTable, violations } from './chaos-report.js';
import { PROFILES, runPhases, runScenario, SCENARIOS } from './chaos-runner.js';
import { CHAOS_MODES, type ChaosMode } from './chaos-topologies.js';

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

const modes: readonly ChaosMode[] =
  values.mode === 'all' ? CHAOS_MODES : [values.mode as ChaosMode];
if (!modes.every((mode) => CHAOS_MODES.includes(mode))) {
  throw new Error(`unknown mode ${values.mode}; use ${CHAOS_MODES.join(', ')} or all`);
}

const started = performance.now();
const results: ScenarioFigures[] = [];
const print = (figures: ScenarioFigures): void => {
  results.push(figures);
  const problems = violations(figures);
  console.log(
    `${problems.length ? '✖' : '✔'} ${figures.name}${problems.length ? `: ${problems.join(', ')}` : ''}`,
  );
  // What the checker noted (the sections involved), so that a failed row can be diagnosed.
  for (const line of problems.length ? figures.notes : []) console.log(`    ${line}`);
};
for (const mode of modes) {
  if (profile.phased) {
    // One session per deployment, every scenario a phase of it (--only does not apply).
    const { phases, session } = await runPhases(profile, mode);
    [...phases, session].map(check).forEach(print);
    continue;
  }
  for (const scenario of scenarios) print(check(await runScenario(scenario, profile, mode)));
}
console.log(`\n${renderTable(results)}\n`);
if (values.report !== '-') {
  await writeMarkdown(
    values.report,
    renderReport(profile, results, (performance.now() - started) / 1000),
  );
  console.log(`report written to ${values.report}`);
}
process.exitCode = results.some((r) => violations(r).length > 0) ? 1 : 0;
