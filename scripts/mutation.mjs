// `npm run test:mutation [-- group ...]`: runs StrykerJS over each group of safety-critical files
// (see stryker.config.mjs; every group when none is named), then prints each file's score and
// every mutant that survived, with its line and what it changed. Exits 1 when a mutant survived.
import { spawnSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { GROUPS } from '../stryker.config.mjs';

const asked = process.argv.slice(2);
const unknown = asked.filter((name) => !(name in GROUPS));
if (unknown.length > 0) {
  console.error(
    `no mutation group ${unknown.join(', ')}; groups: ${Object.keys(GROUPS).join(', ')}`,
  );
  process.exit(2);
}
const names = asked.length > 0 ? asked : Object.keys(GROUPS);

const rows = [];
const survivors = [];
for (const name of names) {
  const run = spawnSync('npx', ['stryker', 'run', 'stryker.config.mjs'], {
    stdio: 'inherit',
    env: { ...process.env, STRYKER_GROUP: name },
  });
  if (run.status !== 0) {
    console.error(`mutation group ${name}: Stryker exited with ${run.status}`);
    process.exit(1);
  }
  const report = JSON.parse(readFileSync(`.stryker-reports/${name}.json`, 'utf8'));
  for (const [file, { mutants }] of Object.entries(report.files)) {
    const count = (...statuses) => mutants.filter((m) => statuses.includes(m.status)).length;
    const killed = count('Killed', 'Timeout');
    const lived = count('Survived', 'NoCoverage');
    const valid = killed + lived;
    rows.push({ file, killed, lived, score: valid === 0 ? 100 : (100 * killed) / valid });
    for (const m of mutants.filter((m) => m.status === 'Survived' || m.status === 'NoCoverage')) {
      const what =
        m.replacement === undefined ? m.mutatorName : `${m.mutatorName}: ${m.replacement}`;
      survivors.push(`${file}:${m.location.start.line} ${m.status} ${what.replace(/\s+/g, ' ')}`);
    }
  }
}

console.log('\n| file | killed | survived | score |\n| --- | --- | --- | --- |');
for (const { file, killed, lived, score } of rows) {
  console.log(`| \`${file}\` | ${killed} | ${lived} | ${score.toFixed(1)} % |`);
}
if (survivors.length > 0) console.log(`\nSurvivors:\n${survivors.join('\n')}`);
process.exit(survivors.length > 0 ? 1 : 0);
