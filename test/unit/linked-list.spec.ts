/**
 * The intrusive list behind the pending replies and the held locks, as pure logic: against an
 * array as the model, over random sequences of additions and removals.
 */
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import fc from 'fast-check';
import { LinkedList, type Linked } from '../../lib/utils/linked-list.js';

interface Entry extends Linked<Entry> {
  readonly id: number;
}

describe('LinkedList', () => {
  it('keeps the order of addition, removes any entry once, and leaves a removed one pointing nowhere', () => {
    fc.assert(
      fc.property(
        fc.array(fc.oneof(fc.constant('push' as const), fc.nat({ max: 40 })), { maxLength: 200 }),
        (steps) => {
          const list = new LinkedList<Entry>();
          const model: Entry[] = [];
          const all: Entry[] = [];
          for (const step of steps) {
            if (step === 'push') {
              const entry: Entry = { id: all.length, prev: undefined, next: undefined };
              all.push(entry);
              model.push(entry);
              list.push(entry);
            } else {
              // Any entry ever added: still in the list, or removed already.
              const entry = all[step % Math.max(all.length, 1)];
              if (!entry) continue;
              const index = model.indexOf(entry);
              assert.equal(list.remove(entry), index >= 0);
              if (index >= 0) model.splice(index, 1);
              assert.equal(entry.prev, undefined);
              assert.equal(entry.next, undefined);
            }
            assert.deepEqual(
              list.toArray().map((entry) => entry.id),
              model.map((entry) => entry.id),
            );
            assert.equal(list.oldest, model[0]);
          }
        },
      ),
    );
  });

  it('toArray() is a copy: removing entries while going through it is safe', () => {
    const list = new LinkedList<Entry>();
    const entries = [0, 1, 2, 3].map((id): Entry => ({ id, prev: undefined, next: undefined }));
    for (const entry of entries) list.push(entry);
    const seen: number[] = [];
    for (const entry of list.toArray()) {
      seen.push(entry.id);
      list.remove(entry);
      if (entry.id === 0) list.remove(entries[2]);
    }
    assert.deepEqual(seen, [0, 1, 2, 3]);
    assert.equal(list.oldest, undefined);
  });
});
