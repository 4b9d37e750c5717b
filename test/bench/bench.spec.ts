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
import { CONTENDERS } from './contenders.js';

const runner = fileURLToPath(new URL('./run-bench.js', import.meta.url));

it('a smoke run of `npm run bench` covers every workload and contender, with no lost update', async () => {
  const child = spawn(process.execPath, [runner, '--smoke', '--rounds', '1', '--report', '-'], {
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let output = '';
  child.stdout.on('data', (chunk: Buffer) => (output += chunk.toString()));
  child.stderr.on('data', (chunk: Buffer) => (output += chunk.toString()));
  const code = await new Promise<number | null>((resolve) => child.once('exit', resolve));
  assert.equal(code, 0, output.slice(-2_000));

  const report = output.slice(output.indexOf('# Benchmark report'));
  for (const section of ['1.', '2.', '3a.', '3b.', '4.', '6.', '7.', '8.', '9.', '5.']) {
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
  // Workload 5: the three routes on both key patterns, every request answered.
  const httpRows = report
    .split('\n')
    .filter((line) => /^\| (a different SKU|one hot SKU)/.test(line));
  assert.equal(httpRows.length, 6);
  for (const row of httpRows) assert.equal(row.split('|').at(-2)!.trim(), '0.00', row);
});
