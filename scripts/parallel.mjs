#!/usr/bin/env node
// `node scripts/parallel.mjs <item> ...`: runs the items side by side and exits 1 if any failed.
// An item is an npm script, or several joined by `+` (`build:test+test:run`): one after the
// other, each only if the one before passed. Each item's output is printed in one piece when it
// ends, except the last item's with `--live`, which goes straight through (the tests' progress).
//
// `npm test` runs ESLint and the other checks beside the test build and the tests: the checks
// read the sources and write nothing another reads, and the tests need only the build. The tests
// begin ~20 s in (after the build), not ~50 s (after the slowest check).
import { spawn } from 'node:child_process';

const args = process.argv.slice(2);
const live = args.includes('--live');
const items = args.filter((arg) => arg !== '--live');

const runScript = (name, streamed) =>
  new Promise((resolve) => {
    const child = spawn('npm', ['run', name, '--silent'], {
      stdio: ['ignore', streamed ? 'inherit' : 'pipe', streamed ? 'inherit' : 'pipe'],
    });
    let output = '';
    child.stdout?.on('data', (chunk) => (output += chunk));
    child.stderr?.on('data', (chunk) => (output += chunk));
    child.on('close', (code) => {
      if (!streamed) process.stdout.write(`\n> npm run ${name}\n${output}`);
      resolve(code ?? 1);
    });
  });

const results = await Promise.all(
  items.map(async (item, index) => {
    const streamed = live && index === items.length - 1;
    for (const name of item.split('+')) {
      if (streamed) process.stdout.write(`\n> npm run ${name}\n`);
      const code = await runScript(name, streamed);
      if (code !== 0) return { name, code };
    }
    return { name: item, code: 0 };
  }),
);
const failed = results.filter(({ code }) => code !== 0);
for (const { name, code } of failed) console.error(`npm run ${name} failed (exit ${code})`);
process.exit(failed.length > 0 ? 1 : 0);
