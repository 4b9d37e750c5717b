/**
 * Which caller a release in the process hands the lock to (`firstInLine`, `holding`), as pure
 * logic over a channel's callers. The rule: the first caller in line by arrival, asleep or with a
 * retry on its way, but only when the releaser's lease outlasts the longest wait for the
 * release's answer; else the first caller asleep (one with an attempt on its way could take a key
 * that lapsed while the release travelled, and the handoff would answer `true` for it).
 */
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import type { HeldLease } from '../../lib/interfaces/lock-backend.interface.js';
import {
  ChannelSubscription,
  firstInLine,
  newChannelState,
} from '../../lib/redis/channel.subscription.js';
import { holding } from '../../lib/redis/handoff.js';

const lease = (left: number, lossReason?: unknown): HeldLease => ({
  fence: 1,
  fenceLimit: 16,
  expiresAt: performance.now() + left,
  lossReason,
  confirmedAt: performance.now(),
});

describe('the heir of a release in the process', () => {
  it('holding: a live lease that outlasts the margin; not a lost one, not one without a lease', () => {
    assert.equal(holding(lease(5_000), 1_000), true);
    assert.equal(holding(lease(900), 1_000), false);
    assert.equal(holding(lease(5_000, new Error('lost')), 1_000), false);
    assert.equal(holding(undefined, 0), false);
    assert.equal(holding(lease(10), 0), true);
  });

  it('firstInLine: the first caller by arrival when holding, even mid-retry; else the first asleep', async () => {
    const state = newChannelState(Promise.resolve());
    const claim = { token: 't', ttl: 1_000 };
    const first = new ChannelSubscription(state, claim, () => {});
    const second = new ChannelSubscription(state, claim, () => {});
    // The second sleeps in the queue; the first is between attempts (a retry on its way).
    const asleep = second.wait(second.seen, 60_000, 60_000, []);
    assert.equal(firstInLine(state, true), first);
    assert.equal(firstInLine(state, false), second);
    // Taken as an heir, the first is no longer in line: the next release looks past it.
    first.reserve();
    assert.equal(firstInLine(state, true), second);
    // Its handoff did not happen: in line again.
    first.wake();
    assert.equal(firstInLine(state, true), first);
    first.dispose(false);
    assert.equal(firstInLine(state, true), second);
    second.dispose(false);
    assert.equal(firstInLine(state, true), undefined);
    second.wake();
    await asleep.catch(() => undefined);
  });
});
