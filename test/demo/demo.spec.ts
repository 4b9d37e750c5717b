/** `npm run demo` as a newcomer runs it: a private Redis, the sample app, the table and the SVG. */
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import { describe, it } from 'node:test';

const demo = fileURLToPath(new URL('./run-demo.js', import.meta.url));

describe('npm run demo', () => {
  it('shows the unlocked route overselling, the locked one not, 409s when busy, and draws the timeline', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'demo-'));
    try {
      const svg = join(dir, 'timeline.svg');
      const env = { ...process.env };
      delete env.REDIS_URL; // as on a fresh machine: the demo starts its own Redis
      const { stdout } = await promisify(execFile)(process.execPath, [demo, '--svg', svg], { env });
      const row = (name: string): string[] =>
        stdout
          .split('\n')
          .find((line) => line.startsWith(`| ${name}`))!
          .split('|')
          .map((cell) => cell.trim());
      const [, , , soldUnlocked, , , , oversold] = row('unlocked route');
      assert.ok(Number(oversold) > 0 && Number(soldUnlocked) > 3, stdout);
      const [, , , soldLocked, soldOut, , left, lockedOversold] = row('@WithLock route, 3 items');
      assert.deepEqual([soldLocked, soldOut, left, lockedOversold], ['3', '9', '0', '0'], stdout);
      const [, , , served, , busy] = row('@WithLock route, busy');
      assert.ok(Number(served) > 0 && Number(busy) > 0, stdout);
      const drawing = readFileSync(svg, 'utf8');
      assert.match(drawing, /^<svg [^>]*xmlns="http:\/\/www.w3.org\/2000\/svg"/);
      assert.ok((drawing.match(/<rect /g) ?? []).length > 40, 'a bar per section');
      assert.match(drawing, /fence \d+/);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});
