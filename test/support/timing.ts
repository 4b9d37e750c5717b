import assert from 'node:assert/strict';
import { monitorEventLoopDelay } from 'node:perf_hooks';
import { Worker } from 'node:worker_threads';

/**
 * What every timer-bound wait may add on an idle machine: the histogram's 10 ms resolution, a
 * promise chain, a socket's close. Everything above it is measured while the test runs: the stalls
 * of this process's event loop and how late the machine ran a thread of its own (see
 * `machineLateness`).
 */
export const FLOOR_MS = 100;

const BUCKET_MS = 100;
const BUCKETS = 1_024;
let probe: { at: Float64Array; late: Float64Array } | undefined;

/**
 * A thread of this process that asks for a 10 ms timer again and again and writes how late each
 * one fired into a ring of 100 ms buckets: when the machine is loaded (other suites, Redis,
 * workers), every process runs late, and so does this thread, though this process's own event
 * loop may have been free. Started once, never keeps the process alive.
 */
function machineProbe(): { at: Float64Array; late: Float64Array } {
  if (probe) return probe;
  const shared = new SharedArrayBuffer(2 * BUCKETS * Float64Array.BYTES_PER_ELEMENT);
  const at = new Float64Array(shared, 0, BUCKETS);
  const late = new Float64Array(shared, BUCKETS * Float64Array.BYTES_PER_ELEMENT, BUCKETS);
  const worker = new Worker(
    `const { workerData: { shared, buckets, bucketMs } } = require('node:worker_threads');
     const at = new Float64Array(shared, 0, buckets);
     const late = new Float64Array(shared, buckets * 8, buckets);
     const now = () => performance.timeOrigin + performance.now();
     const tick = () => {
       const expected = now() + 10;
       setTimeout(() => {
         const t = now();
         const bucket = Math.floor(t / bucketMs);
         const i = bucket % buckets;
         if (at[i] !== bucket) { at[i] = bucket; late[i] = 0; }
         late[i] = Math.max(late[i], t - expected);
         tick();
       }, 10);
     };
     tick();`,
    { eval: true, workerData: { shared, buckets: BUCKETS, bucketMs: BUCKET_MS } },
  );
  worker.unref();
  probe = { at, late };
  return probe;
}

const wallNow = (): number => performance.timeOrigin + performance.now();

/**
 * How late the machine ran the probe's thread at most (ms) between `from` and now (wall-clock ms,
 * `performance.timeOrigin + performance.now()`).
 */
function machineLateness(from: number): number {
  const { at, late } = machineProbe();
  const first = Math.floor(from / BUCKET_MS);
  const last = Math.floor(wallNow() / BUCKET_MS);
  let max = 0;
  for (let bucket = Math.max(first, last - BUCKETS + 1); bucket <= last; bucket++) {
    const i = bucket % BUCKETS;
    if (at[i] === bucket) max = Math.max(max, late[i]);
  }
  return max;
}

export interface Stalls {
  /** The longest this process's event loop stood still (ms). */
  stalled(): number;
  /** What the machine added meanwhile (ms): `FLOOR_MS`, the stalls, and the probe's lateness. */
  slack(): number;
  /** Ends the watch and returns `stalled()`. */
  stop(): number;
}

/**
 * Watches this process's event loop and the machine from now on. On a loaded machine a process may
 * not run at all for a while, and no timer, the library's or the test's, fires before it runs
 * again, so a test that asserts how long a wait took adds `slack()` to its bound instead of a
 * constant tuned until it passes.
 */
export function watchStalls(): Stalls {
  const from = wallNow();
  machineProbe();
  const delay = monitorEventLoopDelay({ resolution: 10 });
  delay.enable();
  const stalled = (): number => delay.max / 1e6;
  return {
    stalled,
    slack: () => FLOOR_MS + stalled() + machineLateness(from),
    stop: () => {
      const max = stalled();
      delay.disable();
      return max;
    },
  };
}

/**
 * Asserts that `elapsed` (ms) is at most `bound` plus what the machine added (`watch.slack()`),
 * and, where the property has one, at least `atLeast` (a deadline not cut short).
 */
export function assertWithin(
  elapsed: number,
  bound: number,
  watch: { slack(): number },
  what: string,
  atLeast?: number,
): void {
  const slack = watch.slack();
  assert.ok(
    elapsed <= bound + slack,
    `${what} took ${elapsed.toFixed(0)} ms: over its bound ${bound} ms by more than the measured slack (${slack.toFixed(0)} ms)`,
  );
  if (atLeast !== undefined) {
    assert.ok(
      elapsed >= atLeast,
      `${what} took ${elapsed.toFixed(0)} ms: under ${atLeast} ms, a deadline cut short`,
    );
  }
}
