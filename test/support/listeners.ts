import type { EventEmitter } from 'node:events';

/** How many listeners `emitter` has, on every event: what a test checks was left as it found. */
export const listeners = (emitter: EventEmitter): number =>
  emitter.eventNames().reduce((sum, name) => sum + emitter.listenerCount(name), 0);
