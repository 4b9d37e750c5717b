#!/usr/bin/env node
// `node scripts/parallel.mjs <npm script> ...`: runs the named npm scripts side by side (the linters
// and the test build read the sources and write nothing another reads), prints each one's output
// in one piece as it ends, and exits 1 if any failed. `npm test` runs ESLint, the other checks and
// the test build so: ~35 s on two cores instead of the ~55 s of lint (one after the other) beside
// the build.
import { spawn } from 'node:child_process';

const names = process.argv.slice(2);
const results = await Promise.all(
  names.map(
    (name) =>
      new Promise((resolve) => {
        const child = spawn('npm', ['run', name, '--silent'], {
          stdio: ['ignore', 'pipe', 'pipe'],
        });
        let output = '';
        child.stdout.on('data', (chunk) => (output += chunk));
        child.stderr.on('data', (chunk) => (output += chunk));
        child.on('close', (code) => {
          process.stdout.write(`\n> npm run ${name}\n${output}`);
          resolve({ name, code });
        });
      }),
  ),
);
const failed = results.filter(({ code }) => code !== 0);
for (const { name, code } of failed) console.error(`npm run ${name} failed (exit ${code})`);
process.exit(failed.length > 0 ? 1 : 0);
