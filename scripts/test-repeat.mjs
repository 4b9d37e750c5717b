#!/usr/bin/env node
// `npm run test:repeat -- --runs N [--burn [M]]`: measures how flaky the suite is. Builds once,
// then runs scripts/test-run.mjs N times; with --burn, M of the runs (all of them if M is not
// given; the later ones) have a CPU burner beside them: one busy process per core, at normal
// priority, as other jobs on a shared CI machine would be. Prints per test file: runs, failures
// at the first try (with and without the burner), failures that a re-run did not clear, and the
// first failure message of each file. Exits 1 if any file failed at all.
//
// Other options are passed to test-run.mjs (e.g. --only waiting, --compat).
import { execFileSync, spawn } from 'node:child_process';
import { availableParallelism } from 'node:os';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

const root = join(import.meta.dirname, '..');
const args = process.argv.slice(2);
const take = (name) => {
  const at = args.indexOf(name);
  if (at < 0) return undefined;
  const next = args[at + 1];
  const value = next !== undefined && /^\d+$/.test(next) ? next : '';
  args.splice(at, value === '' ? 1 : 2);
  return value;
};
const runs = Number(take('--runs') || 4);
const burnArg = take('--burn');
const burnRuns =
  burnArg === undefined ? 0 : burnArg === '' ? runs : Math.min(runs, Number(burnArg));

execFileSync('npm', ['run', 'build:test', '--silent'], { cwd: root, stdio: 'inherit' });
const scratch = mkdtempSync(join(tmpdir(), 'test-repeat-'));
const files = new Map();
const summaries = [];
for (let run = 1; run <= runs; run++) {
  const burning = run > runs - burnRuns;
  const burners = burning ? startBurners() : [];
  const json = join(scratch, `run-${run}.json`);
  const started = performance.now();
  const code = await new Promise((resolve) => {
    const child = spawn(process.execPath, ['scripts/test-run.mjs', '--json', json, ...args], {
      cwd: root,
      stdio: ['ignore', 'ignore', 'inherit'],
    });
    child.once('close', resolve);
  });
  for (const burner of burners) burner.kill('SIGKILL');
  const seconds = ((performance.now() - started) / 1_000).toFixed(0);
  let results = [];
  try {
    results = JSON.parse(readFileSync(json, 'utf8')).results;
  } catch {
    console.log(`run ${run}: test-run.mjs wrote no summary (exit ${code})`);
  }
  for (const { file, attempts } of results) {
    const entry = files.get(file) ?? { runs: 0, failed: 0, failedBurning: 0, stayed: 0, first: '' };
    entry.runs++;
    if (!attempts[0].ok) {
      if (burning) entry.failedBurning++;
      else entry.failed++;
      entry.first ||= `run ${run}: ${attempts[0].failures[0] ?? 'failed'}`;
    }
    if (!attempts.at(-1).ok) entry.stayed++;
    files.set(file, entry);
  }
  const failedFiles = results.filter(({ attempts }) => !attempts[0].ok).length;
  summaries.push(
    `run ${run}${burning ? ' (burner)' : ''}: exit ${code}, ${failedFiles} files failed at the first try, ${seconds} s`,
  );
  console.log(summaries.at(-1));
}
rmSync(scratch, { recursive: true, force: true });

console.log(
  `\n${runs} runs, ${burnRuns} of them with a CPU burner on each of ${availableParallelism()} cores\n`,
);
console.log(
  '| test file | runs | failed (plain) | failed (burner) | failed after re-run | first failure |',
);
console.log('| --- | --- | --- | --- | --- | --- |');
for (const [file, entry] of [...files].sort(([a], [b]) => a.localeCompare(b))) {
  const first = entry.first.replaceAll('|', '\\|').slice(0, 300);
  console.log(
    `| ${file} | ${entry.runs} | ${entry.failed} | ${entry.failedBurning} | ${entry.stayed} | ${first} |`,
  );
}
// The table cuts each failure at 300 characters: a model sequence's name alone can take that.
const failed = [...files].filter(([, entry]) => entry.first !== '');
if (failed.length > 0) console.log('\nFirst failures in full:');
for (const [file, entry] of failed) console.log(`\n${file} — ${entry.first}`);
const total = [...files.values()].reduce((sum, e) => sum + e.failed + e.failedBurning, 0);
console.log(`\n${summaries.join('\n')}\nfailures at the first try: ${total}`);
process.exitCode = total > 0 ? 1 : 0;

/** One busy process per core; killed after the run. */
function startBurners() {
  return Array.from({ length: availableParallelism() }, () =>
    spawn(process.execPath, ['-e', 'for (;;) {}'], { stdio: 'ignore' }),
  );
}
