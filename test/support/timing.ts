import assert from 'node:assert/strict';
import { monitorEventLoopDelay } from 'node:perf_hooks';

/**
 * What a loaded 2-core machine adds to a timer-bound wait besides stalls of this process's own
 * event loop (which `watchStalls` measures): other processes — Redis, workers, other suites —
 * running late too.
 */
export const SLACK_MS = 700;

/**
 * Watches this process's event loop from now on: `stalled()` says how long it stood still at most
 * (ms). On a loaded machine a process may not run at all for a while, and no timer, the library's
 * or the test's, fires before it runs again, so a test that asserts how long a wait took adds this
 * to its bound instead of a constant tuned until it passes. `stop()` ends the watch and returns it.
 */
export function watchStalls(): { stalled(): number; stop(): number } {
  const delay = monitorEventLoopDelay({ resolution: 10 });
  delay.enable();
  const stalled = (): number => delay.max / 1e6;
  return {
    stalled,
    stop: () => {
      const max = stalled();
      delay.disable();
      return max;
    },
  };
}

/**
 * Asserts that `elapsed` (ms) is at most `bound` plus what the machine added: `SLACK_MS` and the
 * longest stall `watch` saw.
 */
export function assertWithin(
  elapsed: number,
  bound: number,
  watch: { stalled(): number },
  what: string,
): void {
  const stalled = watch.stalled();
  assert.ok(
    elapsed <= bound + SLACK_MS + stalled,
    `${what} took ${elapsed.toFixed(0)} ms: over ${bound} ms + ${SLACK_MS} ms of slack + ${stalled.toFixed(0)} ms of event-loop stall`,
  );
}
