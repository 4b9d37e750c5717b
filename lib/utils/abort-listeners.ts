/** What a signal's one listener calls, added and removed in O(1). */
type Listeners = Set<(reason: Error) => void>;

const listening = new WeakMap<AbortSignal, Listeners>();

/**
 * Calls `listener` with `signal`'s reason when it aborts, through one 'abort' listener per signal
 * however many waits watch it: a signal many callers share (a caller's own, or the engine's
 * stopping signal, which every wait watches) never collects a listener per waiter, so it costs the
 * same with 10 waiters as with 20,000 and never trips Node's `MaxListenersExceededWarning`.
 * Returns what stops watching (removing the listener from the set; the signal's own listener stays
 * until it aborts: one closure per signal, never more). `signal` must not have aborted yet.
 */
export function onAbort(signal: AbortSignal, listener: (reason: Error) => void): () => void {
  let listeners = listening.get(signal);
  if (!listeners) {
    const created: Listeners = (listeners = new Set());
    listening.set(signal, created);
    signal.addEventListener(
      'abort',
      () => {
        listening.delete(signal);
        for (const each of created) each(signal.reason as Error);
        created.clear();
      },
      { once: true },
    );
  }
  listeners.add(listener);
  const added = listeners;
  return () => void added.delete(listener);
}

/**
 * Calls `listener` when the first of `signals` aborts (none of them has yet); returns what stops
 * watching them all.
 */
export function onAnyAbort(
  signals: readonly (AbortSignal | undefined)[],
  listener: (reason: Error) => void,
): () => void {
  const stops: (() => void)[] = [];
  for (const signal of signals) if (signal) stops.push(onAbort(signal, listener));
  return () => {
    for (const stop of stops) stop();
  };
}
