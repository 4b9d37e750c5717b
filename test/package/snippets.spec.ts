/**
 * Every TypeScript block of the README and the guides in docs/ that is a whole file (it has an
 * `import`) compiles, strict, as a user would paste it: `nestjs-redis-lock` and
 * `nestjs-redis-lock/health` and `nestjs-redis-lock/testing` resolve to the package's published type declarations (`dist/`, built
 * here as `prepack` builds it: the `.d.ts` without `@internal` items); a relative import that no other
 * block of the same page provides (`./orders.js`: "your own providers") gets a stub whose classes
 * accept anything. Blocks of one page share a directory, so the quick start's two files import
 * each other. Fragments (no `import`) are left to the reader.
 */
import assert from 'node:assert/strict';
import { mkdirSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { dirname, join, relative } from 'node:path';
import { fileURLToPath } from 'node:url';
import { execFileSync } from 'node:child_process';
import { before, describe, it } from 'node:test';
import ts from 'typescript';

const root = fileURLToPath(new URL('../../../', import.meta.url));
const pages = ['README.md', ...readdirSync(join(root, 'docs')).map((file) => `docs/${file}`)];

interface Snippet {
  readonly page: string;
  readonly line: number;
  readonly path: string;
  readonly code: string;
}

/** The whole-file blocks of `page`, each with the file it becomes. */
function snippetsOf(page: string): Snippet[] {
  const text = readFileSync(join(root, page), 'utf8');
  const snippets: Snippet[] = [];
  for (const match of text.matchAll(/```ts\n([\s\S]*?)```/g)) {
    const code = match[1];
    if (!/^import /m.test(code)) continue;
    const line = text.slice(0, match.index).split('\n').length;
    const named = /^\/\/ src\/(\S+)\n/.exec(code);
    snippets.push({ page, line, path: named ? named[1] : `snippet-${line}.ts`, code });
  }
  return snippets;
}

/** A module for a relative import no block provides: each imported name a class of anything. */
function stub(names: string[]): string {
  return names
    .map(
      (name) =>
        `export declare class ${name} {\n  [key: string]: any;\n  constructor(...args: any[]);\n}\n`,
    )
    .join('');
}

describe('the code of the README and the guides', () => {
  before(() => {
    execFileSync('npm', ['run', 'build', '--silent'], { cwd: root, stdio: 'ignore' });
  });

  it('every whole-file TypeScript block compiles, strict, as pasted', () => {
    const work = join(root, 'build', 'snippets');
    rmSync(work, { recursive: true, force: true });
    const files: string[] = [];
    const where = new Map<string, Snippet>();
    for (const page of pages) {
      const dir = join(work, page.replace(/[/.]/g, '_'));
      mkdirSync(dir, { recursive: true });
      writeFileSync(join(dir, 'package.json'), '{ "type": "module" }\n');
      const snippets = snippetsOf(page);
      const provided = new Set(snippets.map((snippet) => snippet.path.replace(/\.ts$/, '.js')));
      const stubs = new Map<string, Set<string>>();
      for (const snippet of snippets) {
        const file = join(dir, snippet.path);
        mkdirSync(dirname(file), { recursive: true });
        writeFileSync(file, snippet.code);
        files.push(file);
        where.set(file, snippet);
        for (const [, names, from] of snippet.code.matchAll(
          /^import (?:type )?\{([^}]*)\} from '\.\/([^']+)'/gm,
        )) {
          if (provided.has(from)) continue;
          const set = stubs.get(from) ?? new Set<string>();
          for (const name of names.split(',')) set.add(name.replace(/^\s*type\s+/, '').trim());
          stubs.set(from, set);
        }
      }
      for (const [from, names] of stubs) {
        writeFileSync(join(dir, from.replace(/\.js$/, '.ts')), stub([...names].filter(Boolean)));
      }
    }
    assert.ok(files.length >= 6, `only ${files.length} whole-file blocks found`);

    const program = ts.createProgram(files, {
      target: ts.ScriptTarget.ES2022,
      module: ts.ModuleKind.NodeNext,
      moduleResolution: ts.ModuleResolutionKind.NodeNext,
      lib: ['lib.es2022.d.ts'],
      types: ['node'],
      strict: true,
      experimentalDecorators: true,
      emitDecoratorMetadata: true,
      skipLibCheck: true,
      noEmit: true,
      paths: {
        'nestjs-redis-lock': [join(root, 'dist/index.d.ts')],
        'nestjs-redis-lock/health': [join(root, 'dist/health/index.d.ts')],
        'nestjs-redis-lock/testing': [join(root, 'dist/testing/index.d.ts')],
      },
    });
    const problems = ts
      .getPreEmitDiagnostics(program)
      .filter((diagnostic) => diagnostic.file && diagnostic.file.fileName.startsWith(work))
      .map((diagnostic) => {
        const file = diagnostic.file as ts.SourceFile;
        const { line } = file.getLineAndCharacterOfPosition(diagnostic.start ?? 0);
        const snippet = where.get(file.fileName);
        const at = snippet
          ? `${snippet.page}:${snippet.line + 1 + line}`
          : relative(work, file.fileName);
        return `${at}: ${ts.flattenDiagnosticMessageText(diagnostic.messageText, '\n')}`;
      });
    assert.deepEqual(problems, []);
  });
});
