/**
 * The key layout, as pure logic: every script gets its keys (and the release channel it publishes
 * on) from one cluster hash slot, whatever the key and prefix. Redis Cluster refuses a script
 * whose keys span slots, and sharded pub/sub needs the channel in the keys' slot.
 */
import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
import { describe, it } from 'node:test';
import { Logger } from '@nestjs/common';
import fc from 'fast-check';
import type { Redis } from 'ioredis';
import { pubSubChoice } from '../../lib/redis/pub-sub.choice.js';
import { RedisLockBackend } from '../../lib/redis/redis-lock.backend.js';
import { PLAIN } from '../../lib/options/checks.js';
import { keySlot } from '../support/redis-server.js';

/**
 * What Redis hashes to find a key's slot: the part between the first `{` and the first `}` after
 * it, if that part is not empty; otherwise the whole key (Redis Cluster specification, "Hash tags").
 */
function hashed(key: string): string {
  const open = key.indexOf('{');
  if (open < 0) return key;
  const close = key.indexOf('}', open + 1);
  if (close < 0 || close === open + 1) return key;
  return key.slice(open + 1, close);
}

interface Call {
  command: string;
  keys: string[];
  channel: string | undefined;
}

/**
 * A stand-in client that records the scripts the backend defines and the calls it makes (each an
 * `EVALSHA <sha> <key count> <keys...> <args...>` through `sendCommand`).
 */
function recordingClient(calls: Call[]): Redis {
  const names = new Map<string, string>();
  const client: Record<string, unknown> = {
    // A Cluster of Redis 7 whose ioredis routes sharded subscriptions: releases use SPUBLISH.
    isCluster: true,
    options: {},
    info: () => Promise.resolve('redis_version:7.0.15\r\n'),
    // Connection events (see `onConnectionLoss`): none come.
    on: () => client,
    off: () => client,
    nodes: () => [],
    duplicate: () => ({ shardedSubscribers: {}, disconnect: () => undefined }),
    defineCommand(name: string, { lua }: { lua: string }) {
      names.set(createHash('sha1').update(lua).digest('hex'), name);
    },
    sendCommand({ name, args }: { name: string; args: unknown[] }) {
      assert.equal(name, 'evalsha');
      const [sha, count, ...rest] = args.map(String);
      const keys = rest.slice(0, Number(count));
      // The release scripts publish on their channel: the argument that ends in ':released'.
      const channel = rest.slice(Number(count)).find((arg) => arg.endsWith(':released'));
      calls.push({ command: names.get(sha)!, keys, channel });
      return Promise.resolve(1);
    },
    exists: (key: string) => (
      calls.push({ command: 'exists', keys: [key], channel: undefined }),
      0
    ),
    get: (key: string) => (calls.push({ command: 'get', keys: [key], channel: undefined }), null),
  };
  return client as unknown as Redis;
}

describe('key layout', () => {
  it('every script call has all its keys, and its release channel, in one hash slot', async () => {
    const text = fc.string({ unit: 'grapheme', minLength: 1, maxLength: 12 });
    const braces = fc.constantFrom('{', '}', '%', '{}', '}{', '%7D', '%25', 'a', ':');
    const key = fc
      .array(fc.oneof(text, braces), { minLength: 1, maxLength: 6 })
      .map((parts) => parts.join(''));
    const prefix = fc.constantFrom('lock:', '', 'app:locks:', '%');
    await fc.assert(
      fc.asyncProperty(key, prefix, fc.constantFrom(0, 60_000), async (k, keyPrefix, retention) => {
        const calls: Call[] = [];
        const backend = new RedisLockBackend(
          recordingClient(calls),
          { keyPrefix, commandTimeout: 1_000, fenceRetention: retention, replicaAck: undefined },
          false,
          new Logger('test'),
        );
        await backend.tryAcquire(k, 't', 1_000);
        await backend.tryAcquire(k, 'g', 1_000, PLAIN, true, true);
        await backend.extend(k, 't', 1_000);
        await backend.raiseFence(k, 't', 5, 1_000, true);
        await backend.release(k, 't');
        for (const shape of [
          { limit: 3, mode: 'write', fair: false },
          { limit: 1, mode: 'read', fair: false },
          { limit: 1, mode: 'write', fair: true },
        ] as const) {
          await backend.tryAcquire(k, 's', 1_000, shape);
          await backend.extend(k, 's', 1_000, shape);
          await backend.release(k, 's', shape);
        }
        await backend.giveUp(k, 's', { limit: 1, mode: 'write', fair: true });
        await backend.giveUp(k, 's', PLAIN);
        await backend.isLocked(k);
        await backend.isHeld(k, 't');
        assert.ok(calls.length >= 16);
        assert.ok(
          calls.some(
            (call) =>
              call.command === 'redisLockReleaseReadSharded' ||
              call.command === 'redisLockReleaseSemaphoreSharded',
          ),
        );
        assert.ok(
          calls.some((call) => call.command.endsWith('Sharded')),
          'SPUBLISH release',
        );
        const slots = new Set<number>();
        const tags = new Set<string>();
        for (const call of calls) {
          const names = call.channel ? [...call.keys, call.channel] : call.keys;
          for (const name of names) {
            slots.add(keySlot(name));
            if (!name.endsWith(':counter')) tags.add(hashed(name));
          }
        }
        // One hash slot for everything about the key (the fence counter, shared by the slot's
        // keys, has a tag of its own that hashes to it), one hash tag for the key's own names, and
        // it is never the whole name.
        assert.equal(slots.size, 1, `${JSON.stringify(calls)}`);
        assert.equal(tags.size, 1, `${JSON.stringify(calls)}`);
        assert.ok(calls.some((call) => call.keys.some((name) => name.endsWith(':counter'))));
        assert.ok(calls.every((call) => call.keys.every((name) => hashed(name) !== name)));
      }),
      { numRuns: 300 },
    );
  });

  it('two different keys never share a lock', () => {
    fc.assert(
      fc.property(fc.string({ minLength: 1 }), fc.string({ minLength: 1 }), (a, b) => {
        fc.pre(a !== b);
        const calls: Call[] = [];
        const backend = new RedisLockBackend(
          recordingClient(calls),
          { keyPrefix: 'lock:', commandTimeout: 1_000, fenceRetention: 0, replicaAck: undefined },
          false,
          new Logger('test'),
        );
        void backend.isLocked(a);
        void backend.isLocked(b);
        assert.notEqual(calls[0].keys[0], calls[1].keys[0]);
      }),
    );
  });
});

describe('pub/sub on Cluster', () => {
  it('is sharded only with Redis >= 7 and an ioredis that routes sharded subscriptions', () => {
    assert.equal(pubSubChoice('7.0.15', true).sharded, true);
    assert.match(pubSubChoice('7.0.15', true).note, /sharded pub\/sub.*7\.0\.15/);
    assert.equal(pubSubChoice('8.2.0', true).sharded, true);
    assert.equal(pubSubChoice('6.2.14', true).sharded, false);
    assert.match(pubSubChoice('6.2.14', true).note, /Redis 6\.2\.14 has no sharded pub\/sub/);
    assert.equal(pubSubChoice('unknown', true).sharded, false);
    assert.equal(pubSubChoice('7.2.4', false).sharded, false);
    assert.match(pubSubChoice('7.2.4', false).note, /ioredis >= 5\.6/);
  });
});
