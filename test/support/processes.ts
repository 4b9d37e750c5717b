import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { once } from 'node:events';
import { fileURLToPath } from 'node:url';
import { uniqueKey } from './lock-module.js';

const worker = fileURLToPath(new URL('../fixtures/lock-worker.js', import.meta.url));

/**
 * One start of `processes` app instances (test/fixtures/lock-worker) against `target` (see the
 * worker's usage) for a control run and a locked run: each first does `raced` read-pause-write
 * increments of a control counter without any lock (concurrent with the others: updates are
 * lost), then `locked` increments of another counter under one lock (a fair one with 'fair').
 * Asserts that every process exited cleanly; resolves both counters, read through `read`.
 */
export async function raceThenLock(
  target: string,
  processes: number,
  raced: number,
  locked: number,
  read: (counter: string) => Promise<string | null>,
  locking: 'lock' | 'fair' = 'lock',
): Promise<{ raced: number; locked: number }> {
  const key = uniqueKey();
  const counter = uniqueKey('counter');
  await runWorkers(
    Array.from({ length: processes }, () => [
      'increment',
      target,
      key,
      counter,
      `${raced}/${locked}`,
      locking,
    ]),
  );
  const [control, exact] = await Promise.all([read(`${counter}:control`), read(counter)]);
  return { raced: Number(control), locked: Number(exact) };
}

/**
 * Like `raceThenLock`, with two keys locked together (`LockService.using([a, b])`): every other
 * process names them in the opposite order. Each step increments one counter per key; resolves
 * both counters of the control run and of the locked run.
 */
export async function transfersRaceThenLock(
  target: string,
  processes: number,
  raced: number,
  locked: number,
  read: (counter: string) => Promise<string | null>,
): Promise<{ raced: number[]; locked: number[] }> {
  const keys = [uniqueKey('acct'), uniqueKey('acct')];
  const prefix = uniqueKey('balance');
  await runWorkers(
    Array.from({ length: processes }, (_, i) => [
      'transfer',
      target,
      (i % 2 === 0 ? keys : [...keys].reverse()).join(','),
      prefix,
      `${raced}/${locked}`,
      'lock',
    ]),
  );
  const counters = (into: string): Promise<number[]> =>
    Promise.all(keys.map(async (key) => Number(await read(`${into}:${key}`))));
  return { raced: await counters(`${prefix}:control`), locked: await counters(prefix) };
}

/**
 * Runs `processes` app instances, each entering a section `iterations` times under a counting
 * semaphore of `limit` on one key (0: no lock at all). Resolves the most holders ever inside at
 * once and how many entries there were, as the workers counted them in Redis (read via `read`;
 * on a Cluster the three counters may live on different nodes: each is a single-key command).
 */
export async function countSemaphore(
  target: string,
  processes: number,
  iterations: number,
  limit: number,
  read: (counter: string) => Promise<string | null>,
): Promise<{ peak: number; entries: number }> {
  const key = uniqueKey('pool');
  const stats = uniqueKey('stats');
  await runWorkers(
    Array.from({ length: processes }, () => [
      'semaphore',
      target,
      key,
      stats,
      String(iterations),
      String(limit),
    ]),
  );
  return {
    peak: Number(await read(`${stats}:peak`)),
    entries: Number(await read(`${stats}:entries`)),
  };
}

/**
 * Runs `readers` reader and `writers` writer app instances on one key (`mode: 'read'` / `'write'`,
 * or no lock at all), `iterations` sections each. Resolves what they counted in Redis (see the
 * worker's `rw` mode): violations of the read/write rule, reader entries that found another reader
 * inside, and the writers' read-pause-write counter.
 */
export async function countReadersWriters(
  target: string,
  readers: number,
  writers: number,
  iterations: number,
  locking: 'lock' | 'nolock',
  read: (counter: string) => Promise<string | null>,
): Promise<{ violations: number; shared: number; counter: number }> {
  const key = uniqueKey('rw');
  const stats = uniqueKey('stats');
  const roles = [...Array<string>(readers).fill('read'), ...Array<string>(writers).fill('write')];
  await runWorkers(
    roles.map((role) => ['rw', target, key, stats, String(iterations), locking, role]),
  );
  const [violations, shared, counter] = await Promise.all(
    ['violations', 'shared', 'counter'].map(async (name) => Number(await read(`${stats}:${name}`))),
  );
  return { violations, shared, counter };
}

/**
 * Runs one worker process per argument list, all starting their work together (the worker's start
 * barrier); asserts that every one exited cleanly.
 */
async function runWorkers(argLists: string[][]): Promise<void> {
  const env = {
    ...process.env,
    LOCK_WORKER_BARRIER: uniqueKey('start'),
    LOCK_WORKER_COUNT: String(argLists.length),
  };
  const children = argLists.map((args) =>
    spawn(process.execPath, [worker, ...args], { stdio: ['ignore', 'ignore', 'inherit'], env }),
  );
  const codes = await Promise.all(children.map(async (child) => (await once(child, 'exit'))[0]));
  assert.deepEqual(
    codes,
    children.map(() => 0),
  );
}
