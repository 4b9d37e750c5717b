import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { Logger } from '@nestjs/common';
import { LockEvents } from '../../lib/engine/lock.events.js';

describe('the hold times behind Retry-After (LockEvents)', () => {
  it('a moving average per key (each hold a quarter), at most the holder’s remaining TTL, none without a holder', () => {
    const events = new LockEvents(new Logger('test'));
    assert.equal(events.expectedWaitMs('k', 5_000), undefined, 'nothing seen');
    events.noteHold('k', 1_000);
    assert.equal(events.expectedWaitMs('k', 5_000), 1_000);
    events.noteHold('k', 3_000);
    assert.equal(events.expectedWaitMs('k', 60_000), 1_500);
    assert.equal(events.expectedWaitMs('k', undefined), undefined, 'no holder known: no estimate');
    assert.equal(events.expectedWaitMs('k', 700), 700, 'never past the holder’s lock');
  });

  it('keeps the last 1,000 keys released, so distinct keys cost bounded memory', () => {
    const events = new LockEvents(new Logger('test'));
    events.noteHold('first', 10);
    events.noteHold('kept', 10);
    for (let i = 0; i < 998; i++) events.noteHold(`k${i}`, 1);
    events.noteHold('kept', 20); // released again: now the most recent
    events.noteHold('one more', 1);
    assert.equal(events.expectedWaitMs('first', 60_000), undefined, 'the oldest went');
    assert.equal(events.expectedWaitMs('kept', 60_000), 12.5);
    events.noteHold('and another', 1);
    assert.equal(events.expectedWaitMs('k0', 60_000), undefined);
    assert.equal(events.expectedWaitMs('kept', 60_000), 12.5);
  });
});
