/**
 * The benchmark itself must keep working (it is not run by `npm test`, so it could rot unseen):
 * a smoke run takes every workload for every contender once, at a tiny size, through the same
 * runner, worker processes and sample app as `npm run bench`, and its report must be complete.
 * What the figures are is not checked here; that every library kept mutual exclusion is.
 */
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { it } from 'node:test';
import { CONTENDERS, type Contender } from './contenders.js';

const runner = fileURLToPath(new URL('./run-bench.js', import.meta.url));
const scriptCost = fileURLToPath(new URL('./run-script-cost.js', import.meta.url));
const decoratorCost = fileURLToPath(new URL('./run-decorator-cost.js', import.meta.url));

/** Runs a benchmark script to its end; its exit code and everything it printed. */
async function run(
  script: string,
  args: string[],
): Promise<{ code: number | null; output: string }> {
  const child = spawn(process.execPath, [script, ...args], { stdio: ['ignore', 'pipe', 'pipe'] });
  let output = '';
  child.stdout.on('data', (chunk: Buffer) => (output += chunk.toString()));
  child.stderr.on('data', (chunk: Buffer) => (output += chunk.toString()));
  const code = await new Promise<number | null>((resolve) => child.once('exit', resolve));
  return { code, output };
}

it('a smoke run of `npm run bench` covers every workload and contender, with no lost update', async () => {
  const { code, output } = await run(runner, ['--smoke', '--rounds', '1', '--report', '-']);
  assert.equal(code, 0, output.slice(-2_000));

  const report = output.slice(output.indexOf('# Benchmark report'));
  for (const section of [
    ...['1.', '2.', '3a.', '3b.', '4.', '6.', '7.', '8.', '9.', '5.'],
    ...['R1.', 'R2.', 'R3.', 'R4.', 'R5.', 'C1.', 'C2.', 'C3.'],
  ]) {
    assert.match(report, new RegExp(`^### ${section.replace('.', '\\.')} `, 'm'), section);
  }
  for (const contender of CONTENDERS) {
    assert.ok(report.includes(`| ${contender.name} |`), contender.name);
  }
  assert.doesNotMatch(report, /NaN|undefined/);
  // Hot-key rows: every contender's non-atomic counter equals its number of sections.
  const hotRows = report
    .split('\n### ')
    .filter((section) => /^3[ab]\. /.test(section))
    .flatMap((section) => section.split('\n'))
    .filter((line) => /^\| .+ \| [\d.]+ \(\d/.test(line));
  assert.equal(
    hotRows.length,
    2 * CONTENDERS.filter((c) => !c.workloads || c.workloads.includes('hot')).length,
  );
  for (const row of hotRows) assert.equal(row.split('|')[3].trim(), '0.00', row);
  // The scaling workloads (smallest sizes): the instances' hot key kept exclusion too, and every
  // parked waiter got the key. (A first cell may be negative: at 1,000 keys a heap figure is noise.)
  const scaleRows = (number: string): string[] =>
    report
      .split('\n### ')
      .filter((section) => section.startsWith(`${number} `))
      .flatMap((section) => section.split('\n'))
      .filter((line) => /^\| [^-|][^|]* \| -?[\d.]+/.test(line) && !line.startsWith('| contender'));
  assert.equal(scaleRows('7.').length, 4);
  for (const row of scaleRows('7.')) assert.equal(row.split('|')[3].trim(), '0.00', row);
  assert.equal(scaleRows('8.').length, 4);
  for (const row of scaleRows('8.')) assert.equal(row.split('|').at(-2)!.trim(), '0.00', row);
  assert.equal(scaleRows('9.').length, 4);
  // The Redlock and Cluster sections: every contender that runs there, the hot key kept exclusive.
  const sectionRows = (number: string): string[] =>
    report
      .split('\n### ')
      .filter((section) => section.startsWith(`${number} `))
      .flatMap((section) => section.split('\n'))
      .filter((line) => /^\| .+ \| [\d.]+ \(\d/.test(line));
  const on = (topology: 'redlock' | 'cluster'): Contender[] =>
    CONTENDERS.filter((c) => c.topologies?.includes(topology) && !c.retryVariant);
  const hotSections = [
    ['R3.', 'redlock'],
    ['R4.', 'redlock'],
    ['C2.', 'cluster'],
    ['C3.', 'cluster'],
  ] as const;
  for (const [number, topology] of hotSections) {
    assert.deepEqual(
      sectionRows(number).map((row) => row.split('|')[1].trim()),
      on(topology).map((c) => c.name),
      number,
    );
    for (const row of sectionRows(number)) assert.equal(row.split('|')[3].trim(), '0.00', row);
  }
  // Workload 5: the four routes on both key patterns, every request answered.
  const httpRows = report
    .split('\n')
    .filter((line) => /^\| (a different SKU|one hot SKU)/.test(line));
  assert.equal(httpRows.length, 8);
  for (const row of httpRows) assert.equal(row.split('|').at(-2)!.trim(), '0.00', row);
});

it('`npm run bench:scripts` measures every step, each of which took and released the key', async () => {
  // Every pair checks its replies (the key taken, then released by its owner): a step that did
  // not do what its row says stops the run with a non-zero exit.
  const { code, output } = await run(scriptCost, ['--rounds', '2', '--pairs', '200']);
  assert.equal(code, 0, output.slice(-2_000));
  const rows = output.split('\n').filter((line) => /^\| .+ \| [\d.]+× \|/.test(line));
  assert.equal(rows.length, 8, output);
  assert.match(rows[0], /^\| hand-written minimum.* \| 1\.00× \|/);
  assert.match(rows[7], /^\| the library/);
  assert.doesNotMatch(output, /NaN|undefined/);
});

it('`npm run bench:decorator` measures every kind of locked call', async () => {
  const { code, output } = await run(decoratorCost, ['--rounds', '3', '--calls', '50']);
  assert.equal(code, 0, output.slice(-2_000));
  const rows = output
    .split('\n')
    .filter((line) => /^\| .+ \| [\d.]+ \| (—|-?[\d.]+) \| [\d.]+ \|$/.test(line));
  assert.deepEqual(
    rows.map((row) => row.split('|')[1].trim()),
    [
      'hand-written minimum lock around the method',
      '`LockService.using()`',
      '`@WithLock`',
      '`@WithLock` whose method calls another on the same key (re-entry)',
    ],
    output,
  );
  assert.doesNotMatch(output, /NaN|undefined/);
});
