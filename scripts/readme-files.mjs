#!/usr/bin/env node
// Writes the README's ```ts blocks that start with a `// src/<path>` comment into <dir>/<path>:
// the quick start, as a user pastes it. Usage: node scripts/readme-files.mjs README.md <dir>
import { mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { dirname, join } from 'node:path';

const [readme, dir] = process.argv.slice(2);
const blocks = readFileSync(readme, 'utf8').matchAll(/```ts\n\/\/ src\/(\S+)\n([\s\S]*?)```/g);
let written = 0;
for (const [, path, code] of blocks) {
  mkdirSync(dirname(join(dir, path)), { recursive: true });
  writeFileSync(join(dir, path), code);
  written++;
}
if (written === 0) throw new Error(`no "// src/..." code blocks in ${readme}`);
console.log(`  ${written} files from ${readme}`);
