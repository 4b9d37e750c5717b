import assert from 'node:assert/strict';
import type { LeaderInfo, LeaderTerm, LockService } from '../../lib/index.js';
import { eventually } from './lock-module.js';

/**
 * Two campaigns for `key` (ids `pod-0`, `pod-1`, one in each of `campaigners`), read by `reader`,
 * which campaigns for nothing: nobody leads before; then the first term's leader, fence and one
 * transition, and both participants (`onFirstTerm` may look further); the leader stops, the other
 * leads with a greater fence, two transitions, one participant (read inside `whileSecond`, which
 * may put a fault around the reads); both stop, and nobody leads or campaigns.
 */
export async function assertElectionReadable(
  campaigners: readonly [LockService, LockService],
  reader: LockService,
  key: string,
  {
    onFirstTerm = async () => {},
    whileSecond = (read) => read(),
  }: {
    onFirstTerm?: (info: LeaderInfo) => Promise<void>;
    whileSecond?: (read: () => Promise<void>, term: LeaderTerm) => Promise<void>;
  } = {},
): Promise<void> {
  assert.equal(await reader.leader(key), null, 'a leader before any campaign');
  assert.deepEqual(await reader.participants(key), []);
  const leaderships = campaigners.map((locks, i) =>
    locks.lead(
      key,
      ({ signal }) => new Promise((resolve) => signal.addEventListener('abort', resolve)),
      {
        id: `pod-${i}`,
        ttl: 3_000,
      },
    ),
  );
  try {
    const first = await Promise.race(leaderships.map((each) => each.elected()));
    assert.ok(
      await eventually(async () => (await reader.leader(key))?.fence === first.fence),
      'the first term never showed in leader()',
    );
    const info = await reader.leader(key);
    assert.deepEqual([info?.id, info?.transitions], [first.id, 1]);
    assert.deepEqual(await reader.participants(key), ['pod-0', 'pod-1']);
    await onFirstTerm(info!);

    const leading = leaderships.find(({ id }) => id === first.id)!;
    await leading.stop();
    const next = await leaderships.find((each) => each !== leading)!.elected();
    assert.ok(next.fence > first.fence, `fence ${next.fence} after ${first.fence}`);
    await whileSecond(async () => {
      // (In Redlock mode a node that got the lock's copy only later has the record by the next
      // renewal of the leader's stay, a third of its TTL on.)
      assert.ok(
        await eventually(async () => (await reader.leader(key))?.fence === next.fence, 15_000),
        'the second term never showed in leader()',
      );
      const second = await reader.leader(key);
      assert.deepEqual([second?.id, second?.transitions], [next.id, 2]);
      assert.deepEqual(await reader.participants(key), [next.id], 'a stopped campaign is listed');
    }, next);
  } finally {
    await Promise.all(leaderships.map((each) => each.stop()));
  }
  assert.equal(await reader.leader(key), null, 'a leader after every campaign stopped');
  assert.deepEqual(await reader.participants(key), []);
}
