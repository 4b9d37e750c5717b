import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { ReplyDeadlines } from '../../lib/utils/reply-deadlines.js';
import { DEADLINE, within } from '../../lib/utils/within.js';

/**
 * A command already sent when its caller's signal had aborted: the bound rejects at once, and the
 * command's own failure later (the connection lost) must not surface as an unhandled rejection.
 */
async function unhandledAfter(
  bind: (command: Promise<string>, signal: AbortSignal) => Promise<string>,
) {
  const seen: unknown[] = [];
  const listener = (reason: unknown): void => void seen.push(reason);
  process.on('unhandledRejection', listener);
  try {
    let fail!: (error: Error) => void;
    const command = new Promise<string>((_, reject) => (fail = reject));
    const abort = new AbortController();
    abort.abort(new Error('caller gave up'));
    await assert.rejects(bind(command, abort.signal), { message: 'caller gave up' });
    fail(new Error('Connection is closed.'));
    await new Promise((resolve) => setTimeout(resolve, 20));
  } finally {
    process.off('unhandledRejection', listener);
  }
  return seen;
}

describe('bounds on a reply', () => {
  it('within(): an already aborted signal rejects at once and leaves the command handled', async () => {
    assert.deepEqual(
      await unhandledAfter((command, signal) => within(command, 1_000, [signal])),
      [],
    );
  });

  it('ReplyDeadlines.bound(): the same, with and without an error mapping', async () => {
    const deadlines = new ReplyDeadlines(1_000);
    assert.deepEqual(
      await unhandledAfter((command, signal) => deadlines.bound(command, signal)),
      [],
    );
    assert.deepEqual(
      await unhandledAfter((command, signal) =>
        deadlines.bound(command, signal, false, (reason) => reason as Error),
      ),
      [],
    );
  });

  it('ReplyDeadlines: replies past the bound reject in the order they came, those in time resolve, interrupt() rejects only interruptible ones', async () => {
    const deadlines = new ReplyDeadlines(60);
    const never = (): Promise<string> => new Promise<string>(() => {});
    const outcomes: string[] = [];
    const track = (name: string, pending: Promise<string>): Promise<void> =>
      pending.then(
        (value) => void outcomes.push(`${name} ${value}`),
        (error: Error) =>
          void outcomes.push(`${name} ${error === DEADLINE ? 'deadline' : error.message}`),
      );
    const settled = [
      track('a', deadlines.bound(never())),
      track('b', deadlines.bound(Promise.resolve('ok'))),
      track('c', deadlines.bound(never(), undefined, true)),
    ];
    await new Promise((resolve) => setTimeout(resolve, 30));
    settled.push(track('d', deadlines.bound(never())));
    deadlines.interrupt(new Error('shutdown'));
    // The deadline timer is unreferenced (a pending reply's socket keeps a process alive): here
    // nothing else would.
    const alive = setTimeout(() => {}, 1_000);
    await Promise.all(settled);
    clearTimeout(alive);
    assert.deepEqual(outcomes, ['b ok', 'c shutdown', 'a deadline', 'd deadline']);
  });
});
