/**
 * What `npm pack` ships: build the package as `prepack` would (`npm run build`), then inspect the
 * file list npm would pack and the `exports` map, as a user's install sees them.
 */
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { before, describe, it } from 'node:test';

const root = fileURLToPath(new URL('../../../', import.meta.url));
const npm = (...args: string[]): string =>
  execFileSync('npm', args, { cwd: root, encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'] });

interface Manifest {
  exports: Record<string, string | { types: string; default: string }>;
  peerDependencies: Record<string, string>;
  peerDependenciesMeta: Record<string, { optional?: boolean }>;
}

describe('the npm package', () => {
  let files: string[];
  const manifest = JSON.parse(readFileSync(join(root, 'package.json'), 'utf8')) as Manifest;
  const read = (path: string): string => readFileSync(join(root, path), 'utf8');

  before(() => {
    npm('run', 'build', '--silent');
    const [packed] = JSON.parse(npm('pack', '--dry-run', '--json', '--ignore-scripts')) as {
      files: { path: string }[];
    }[];
    files = packed.files.map((file) => file.path).sort();
  });

  it('ships dist, the README and the license, nothing else', () => {
    const outside = files.filter(
      (path) =>
        !path.startsWith('dist/') && !['package.json', 'README.md', 'LICENSE'].includes(path),
    );
    assert.deepEqual(outside, []);
    for (const needed of ['README.md', 'LICENSE', 'dist/index.js', 'dist/index.d.ts']) {
      assert.ok(files.includes(needed), `${needed} is packed`);
    }
    // Source maps only with their sources: no sources ship, so no maps.
    assert.deepEqual(
      files.filter((path) => path.endsWith('.map')),
      [],
    );
    assert.ok(files.every((path) => !path.endsWith('.ts') || path.endsWith('.d.ts')));
  });

  it('exports `.`, `./health` and `./testing`, types and JS, each to a packed file', () => {
    assert.deepEqual(Object.keys(manifest.exports).sort(), [
      '.',
      './health',
      './package.json',
      './testing',
    ]);
    for (const entry of ['.', './health', './testing']) {
      const target = manifest.exports[entry] as { types: string; default: string };
      for (const path of [target.types, target.default]) {
        assert.ok(files.includes(path.replace(/^\.\//, '')), `${entry} → ${path} is packed`);
      }
    }
  });

  it('keeps @nestjs/terminus out of the main entry: it is an optional peer for ./health only', () => {
    assert.equal(manifest.peerDependenciesMeta['@nestjs/terminus']?.optional, true);
    const main = files.filter(
      (path) => path.startsWith('dist/') && !path.startsWith('dist/health/'),
    );
    for (const path of main) {
      assert.doesNotMatch(read(path), /@nestjs\/terminus/, `${path} loads Terminus`);
    }
    assert.match(read('dist/health/redis-lock.health.js'), /@nestjs\/terminus/);
  });

  it('has the JSDoc in its type declarations', () => {
    const service = read('dist/lock.service.d.ts');
    assert.match(service, /Takes the lock on `key`, waiting up to `acquireTimeout`/);
    assert.match(service, /@throws LockAcquireTimeoutError/);
    assert.match(read('dist/interfaces/redis-lock-options.interface.d.ts'), /@default 1_000/);
    assert.match(read('dist/health/redis-lock.health.d.ts'), /Up when Redis answers a PING/);
  });

  it('leaves @internal items out of its type declarations, which type-check on their own', () => {
    const declarations = files.filter((path) => path.endsWith('.d.ts'));
    const text = declarations.map(read).join('\n');
    for (const internal of [
      'class Campaign',
      'class Leaderships',
      'startLeaderMethods',
      'checkHealth(',
    ]) {
      assert.ok(!text.includes(internal), `${internal} is in the published .d.ts`);
    }
    // What a consumer with skipLibCheck off compiles: every .d.ts, strict, no stripped member that
    // another declaration still needs (a class that no longer implements its interface).
    execFileSync(
      process.execPath,
      [
        join(root, 'node_modules/typescript/bin/tsc'),
        ...['--ignoreConfig', '--noEmit', '--strict', '--target', 'es2022', '--types', 'node'],
        ...['--module', 'nodenext', '--moduleResolution', 'nodenext', '--experimentalDecorators'],
        ...declarations,
      ],
      { cwd: root, encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'] },
    );
  });
});
