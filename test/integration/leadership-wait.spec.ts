/**
 * A follower's campaign waits for the lock a minute at a time (`CAMPAIGN_WAIT` in
 * lib/lock.leadership.ts) and then starts over. Its own file, in a lane of its own in the gate
 * (`scripts/test-run.mjs`): the test waits that minute out, mostly idle.
 */
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import type { LeaderTerm, LockEvent } from '../../lib/index.js';
import {
  eventually,
  LogCapture,
  sleep,
  startLockModule,
  uniqueKey,
  type LockModuleFixture,
} from '../support/lock-module.js';
import { startRedis, type RedisServer } from '../support/redis-server.js';
import { assertWithin, watchStalls } from '../support/timing.js';

/** How long a campaign attempt waits for the lock before it starts over (CAMPAIGN_WAIT). */
const CAMPAIGN_WAIT = 60_000;

const leadUntilAborted = async (term: LeaderTerm): Promise<void> =>
  new Promise((resolve) => term.signal.addEventListener('abort', () => resolve(), { once: true }));

describe('a follower waiting a minute behind a leader', { timeout: 120_000 }, () => {
  let server: RedisServer;
  const apps: LockModuleFixture[] = [];
  let logs: ReturnType<typeof LogCapture.install>;

  before(async () => {
    server = await startRedis();
    for (let i = 0; i < 2; i++) apps.push(await startLockModule({ connection: server.url }));
    logs = LogCapture.install(); // after compile(): the testing module installs its own logger
  });
  after(async () => {
    for (const app of apps) await app.close();
    await server?.stop();
    logs?.restore();
  });

  it("starts its wait over when it ends, silently: no outage logged, and the leader's release still wakes it at once (found by mutation testing)", async () => {
    const key = uniqueKey('leader');
    const leader = apps[0].locks.lead(key, leadUntilAborted, { ttl: 5_000 });
    assert.ok(await eventually(() => leader.isLeader));
    const timeouts: LockEvent[] = [];
    const subscription = apps[1].locks.events.subscribe((event) => {
      if (event.type === 'timeout' && event.key === key) timeouts.push(event);
    });
    const follower = apps[1].locks.lead(key, leadUntilAborted, { ttl: 5_000 });
    try {
      // Its first wait ends (the event says so: the path is reached), and a second one begins.
      assert.ok(
        await eventually(() => timeouts.length === 1, CAMPAIGN_WAIT + 10_000),
        'the wait never ended',
      );
      assert.ok(timeouts[0].type === 'timeout' && timeouts[0].waitedMs >= CAMPAIGN_WAIT - 5);
      await sleep(500); // were it taken for an outage, its warning comes with the wait's end
      const said = logs.capture.lines.filter(
        ({ level, message }) => ['warn', 'error'].includes(level) && message.includes(key),
      );
      assert.deepEqual(said, [], 'a wait that ended is no outage');
      assert.equal(follower.isLeader, false);
      const stalls = watchStalls();
      const stopped = performance.now();
      await leader.stop();
      assert.ok(await eventually(() => follower.isLeader, 5_000), 'the follower never led');
      // Woken by the release (its new wait is queued as the first was), not by a poll.
      assertWithin(performance.now() - stopped, 100, stalls, "the follower's term");
      stalls.stop();
    } finally {
      subscription.unsubscribe();
      await leader.stop();
      await follower.stop();
    }
  });
});
