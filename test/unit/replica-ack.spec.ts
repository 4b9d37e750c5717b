/**
 * `replicaAck` writes during a Cluster failover or resharding, as pure logic over a stand-in
 * Cluster client whose pipelines answer what the test scripts: a `MOVED` or `READONLY` reply to
 * the lock script (ioredis does not follow a redirection in a pipeline whose `WAIT` got none)
 * refreshes the slot map and sends the pair again, up to 5 times, then fails with that reply.
 * The integration side (the lock on the replica, the write resent after a real failover) is
 * cluster-failover.spec's.
 */
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import type { Cluster } from 'ioredis';
import { replicated } from '../../lib/redis/replica-ack.js';

/** A Cluster client whose pipelines answer `replies` in turn; counts refreshes and sends. */
function standIn(replies: (Error | number)[]): {
  client: Cluster;
  sent: string[];
  refreshes: number;
} {
  const state = { sent: [] as string[], refreshes: 0 };
  const client = {
    isCluster: true,
    refreshSlotsCache(callback: () => void) {
      state.refreshes++;
      callback();
    },
    pipeline() {
      const commands: string[] = [];
      const pipeline = {
        redisLockAcquire: (...args: (string | number)[]) =>
          void commands.push(`acquire ${args.join(' ')}`),
        wait: (replicas: number, timeout: number) => {
          commands.push(`wait ${replicas} ${timeout}`);
          return pipeline;
        },
        exec: () => {
          state.sent.push(commands.join(' + '));
          const reply = replies.shift() ?? 1;
          return Promise.resolve(
            reply instanceof Error
              ? [
                  [reply, null],
                  [null, 0],
                ]
              : [
                  [null, reply],
                  [null, 1],
                ],
          );
        },
      };
      return pipeline;
    },
  } as unknown as Cluster;
  return {
    client,
    get sent() {
      return state.sent;
    },
    get refreshes() {
      return state.refreshes;
    },
  };
}

const ack = { replicas: 1, timeout: 100 };
const write = (client: Cluster): Promise<[number, number]> =>
  replicated(client, ack, 'redisLockAcquire', ['lock:{k}', 'token']);

describe('replicaAck writes follow MOVED and READONLY', () => {
  for (const redirection of [
    'MOVED 1234 127.0.0.1:7001',
    'READONLY You can’t write against a read only replica.',
  ]) {
    const name = redirection.split(' ')[0];
    it(`${name}: refreshes the slot map and sends script and WAIT again`, async () => {
      const fake = standIn([new Error(redirection), new Error(redirection), 1]);
      assert.deepEqual(await write(fake.client), [1, 1]);
      assert.equal(fake.refreshes, 2);
      assert.deepEqual(fake.sent, Array(3).fill('acquire lock:{k} token + wait 1 100'));
    });

    it(`${name}: up to 5 times, then fails with the reply`, async () => {
      const fake = standIn(Array.from({ length: 6 }, () => new Error(redirection)));
      await assert.rejects(write(fake.client), (error: Error) => error.message === redirection);
      assert.equal(fake.refreshes, 5);
      assert.equal(fake.sent.length, 6);
      const succeeds = standIn([...Array.from({ length: 5 }, () => new Error(redirection)), 1]);
      assert.deepEqual(await write(succeeds.client), [1, 1], 'the fifth resend still counts');
    });
  }

  it('any other error is not resent', async () => {
    const fake = standIn([new Error('NOSCRIPT No matching script'), 1]);
    await assert.rejects(write(fake.client), /NOSCRIPT/);
    assert.equal(fake.sent.length, 1);
    assert.equal(fake.refreshes, 0);
  });
});
