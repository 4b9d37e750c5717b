import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { once } from 'node:events';
import { fileURLToPath } from 'node:url';
import { uniqueKey } from './lock-module.js';

const worker = fileURLToPath(new URL('../fixtures/lock-worker.js', import.meta.url));

/**
 * Runs `processes` app instances (test/fixtures/lock-worker) against `target` (see the worker's
 * usage), each doing `iterations` read-pause-write increments of one counter, under one lock or
 * without it. Asserts that every process exited cleanly; resolves the counter's final value,
 * read through `read`.
 */
export async function countIncrements(
  target: string,
  processes: number,
  iterations: number,
  locking: 'lock' | 'nolock',
  read: (counter: string) => Promise<string | null>,
): Promise<number> {
  const key = uniqueKey();
  const counter = uniqueKey('counter');
  const children = Array.from({ length: processes }, () =>
    spawn(
      process.execPath,
      [worker, 'increment', target, key, counter, String(iterations), locking],
      { stdio: ['ignore', 'ignore', 'inherit'] },
    ),
  );
  const codes = await Promise.all(children.map(async (child) => (await once(child, 'exit'))[0]));
  assert.deepEqual(
    codes,
    children.map(() => 0),
  );
  return Number(await read(counter));
}
