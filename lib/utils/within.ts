import { onAnyAbort } from './abort-listeners.js';

/** Rejection reason of `within()` when the time ran out (internal, never escapes the library). */
export const DEADLINE = new Error('deadline');

/**
 * Settles like `promise`, unless `ms` pass first (rejects with `DEADLINE`) or one of `signals`
 * aborts (rejects with its reason). Leaves no timer or listener behind either way.
 */
export function within<T>(
  promise: Promise<T>,
  ms: number | undefined,
  signals: readonly (AbortSignal | undefined)[],
): Promise<T> {
  const aborted = signals.find((signal) => signal?.aborted);
  if (aborted) return abandon(promise, aborted.reason as Error);
  return new Promise<T>((resolve, reject) => {
    const timer =
      ms === undefined ? undefined : setTimeout(() => (cleanup(), reject(DEADLINE)), ms);
    const stopWatching = onAnyAbort(signals, (reason) => (cleanup(), reject(reason)));
    const cleanup = (): void => {
      clearTimeout(timer);
      stopWatching();
    };
    promise.then(
      (value) => (cleanup(), resolve(value)),
      (error: unknown) => (cleanup(), reject(error as Error)),
    );
  });
}

/**
 * Rejects with `reason` without waiting for `promise`, a command already sent: whatever it ends
 * in later (a reply, or the connection's loss) is dropped here, never left an unhandled rejection.
 */
export function abandon<T>(promise: Promise<unknown>, reason: Error): Promise<T> {
  promise.then(undefined, () => {
    // Nobody waits for it any more.
  });
  return Promise.reject(reason);
}

/** For `.catch()` after `within()` when running out of time is an acceptable outcome. */
export function ignoreDeadline(error: unknown): void {
  if (error !== DEADLINE) throw error;
}
