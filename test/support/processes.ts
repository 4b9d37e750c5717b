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

/** What the semaphore workers counted: the most holders inside at once, every entry. */
interface SemaphoreCount {
  peak: number;
  entries: number;
}

/**
 * One start of `processes` app instances for a control run and a locked run: each enters a
 * section `raced` times without any lock, then `locked` times under a counting semaphore of
 * `limit` on one key. Resolves, for each run, the most holders ever inside at once and how many
 * entries there were, as the workers counted them in Redis (read via `read`; on a Cluster the
 * counters may live on different nodes: each is a single-key command).
 */
export async function countSemaphore(
  target: string,
  processes: number,
  raced: number,
  locked: number,
  limit: number,
  read: (counter: string) => Promise<string | null>,
): Promise<{ raced: SemaphoreCount; locked: SemaphoreCount }> {
  const key = uniqueKey('pool');
  const stats = uniqueKey('stats');
  await runWorkers(
    Array.from({ length: processes }, () => [
      'semaphore',
      target,
      key,
      stats,
      `${raced}/${locked}`,
      String(limit),
    ]),
  );
  const count = async (into: string): Promise<SemaphoreCount> => ({
    peak: Number(await read(`${into}:peak`)),
    entries: Number(await read(`${into}:entries`)),
  });
  return { raced: await count(`${stats}:control`), locked: await count(stats) };
}

/** What the reader and writer workers counted (see the worker's `rw` mode). */
interface ReadersWritersCount {
  violations: number;
  shared: number;
  counter: number;
}

/**
 * One start of `readers` reader and `writers` writer app instances on one key for a control run
 * (`raced` sections each, no lock) and a locked run (`locked` sections each, `mode: 'read'` /
 * `'write'`). Resolves what each run counted in Redis: violations of the read/write rule, reader
 * entries that found another reader inside, and the writers' read-pause-write counter.
 */
export async function countReadersWriters(
  target: string,
  readers: number,
  writers: number,
  raced: number,
  locked: number,
  read: (counter: string) => Promise<string | null>,
): Promise<{ raced: ReadersWritersCount; locked: ReadersWritersCount }> {
  const key = uniqueKey('rw');
  const stats = uniqueKey('stats');
  const roles = [...Array<string>(readers).fill('read'), ...Array<string>(writers).fill('write')];
  await runWorkers(roles.map((role) => ['rw', target, key, stats, `${raced}/${locked}`, role]));
  const count = async (into: string): Promise<ReadersWritersCount> => {
    const [violations, shared, counter] = await Promise.all(
      ['violations', 'shared', 'counter'].map(async (name) =>
        Number(await read(`${into}:${name}`)),
      ),
    );
    return { violations, shared, counter };
  };
  return { raced: await count(`${stats}:control`), locked: await count(stats) };
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
