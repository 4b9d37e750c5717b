#!/usr/bin/env node
// Checks the README and the guides in docs/: every relative link names a file that exists and,
// with a #fragment, a heading of that file (GitHub's anchors); and the README stays a front door
// (at most MAX_README_LINES lines). Part of `npm run lint`.
import { existsSync, readdirSync, readFileSync } from 'node:fs';
import { dirname, join, relative } from 'node:path';

const root = join(import.meta.dirname, '..');
const MAX_README_LINES = 400;
const files = [
  'README.md',
  'CHANGELOG.md',
  ...readdirSync(join(root, 'docs')).map((f) => `docs/${f}`),
].filter((file) => file.endsWith('.md'));

/** GitHub's anchor of a heading: lower case, punctuation but `-` and `_` dropped, spaces to `-`. */
const slug = (heading) =>
  heading
    .trim()
    .toLowerCase()
    .replace(/[^\p{L}\p{N}\s_-]/gu, '')
    .replace(/ /g, '-');

/** The headings of a Markdown file outside code blocks, as anchors (repeats get -1, -2, …). */
function anchors(file) {
  const seen = new Map();
  const result = new Set();
  let fenced = false;
  for (const line of readFileSync(join(root, file), 'utf8').split('\n')) {
    if (line.startsWith('```')) fenced = !fenced;
    const heading = !fenced && /^#{1,6} (.*)$/.exec(line);
    if (!heading) continue;
    const base = slug(heading[1]);
    const count = seen.get(base) ?? 0;
    seen.set(base, count + 1);
    result.add(count === 0 ? base : `${base}-${count}`);
  }
  return result;
}

const problems = [];
for (const file of files) {
  const text = readFileSync(join(root, file), 'utf8');
  const prose = text.replace(/```[\s\S]*?```/g, '');
  for (const [, target] of prose.matchAll(/\]\(([^)\s]+)\)/g)) {
    if (/^[a-z]+:/i.test(target)) continue; // https:, mailto:
    const [path, fragment] = target.split('#');
    const resolved = path ? relative(root, join(root, dirname(file), path)) : file;
    if (!existsSync(join(root, resolved))) {
      problems.push(`${file}: link to ${target}: no file ${resolved}`);
    } else if (
      fragment !== undefined &&
      resolved.endsWith('.md') &&
      !anchors(resolved).has(fragment)
    ) {
      problems.push(`${file}: link to ${target}: ${resolved} has no heading #${fragment}`);
    }
  }
}
const readmeLines = readFileSync(join(root, 'README.md'), 'utf8').split('\n').length;
if (readmeLines > MAX_README_LINES) {
  problems.push(
    `README.md has ${readmeLines} lines: keep it a front door (≤ ${MAX_README_LINES}); move detail into docs/`,
  );
}
if (problems.length > 0) {
  console.error(problems.join('\n'));
  process.exit(1);
}
console.log(`docs: ${files.length} files, every link resolves; README ${readmeLines} lines`);
