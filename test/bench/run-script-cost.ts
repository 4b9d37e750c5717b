/**
 * `npm run bench:scripts`: what each guarantee of an uncontended lock costs, one step at a time.
 * Workload 1 of `npm run bench` (sequential acquire + release of a free key) with the lock's
 * commands sent by hand, from the hand-written minimum up to exactly what the library sends, then
 * the library itself: each row adds one thing to the row above. One process, one private
 * redis-server, the rows' order rotated each round; per row the medians over the rounds of the
 * wall time, the client's CPU, the server's CPU (`INFO cpu`) and the server's time inside commands
 * (`INFO commandstats`) per pair, and the pairs/s as a ratio to the minimum's in the same round.
 *
 * Options: --pairs N (20,000 per row and round), --rounds N (5).
 */
import 'reflect-metadata';
import { Logger } from '@nestjs/common';
import { Redis } from 'ioredis';
import { randomBytes } from 'node:crypto';
import { parseArgs } from 'node:util';
import { LockService } from '../../lib/index.js';
import {
  ACQUIRE_SCRIPT,
  EXTEND_SCRIPT,
  FENCE_STRIDE,
  RELEASE_SCRIPT,
} from '../../lib/redis/lock.scripts.js';
import { freshToken } from '../../lib/utils/token.js';
import { percentile } from '../chaos/chaos-checker.js';
import { startRedis } from '../support/redis-server.js';

const { values } = parseArgs({
  options: {
    pairs: { type: 'string', default: '20000' },
    rounds: { type: 'string', default: '5' },
  },
});
const pairs = Number(values.pairs);
const rounds = Number(values.rounds);

const server = await startRedis();
const client = new Redis(server.port, '127.0.0.1');
const admin = new Redis(server.port, '127.0.0.1');
const load = (lua: string): Promise<string> => client.script('LOAD', lua) as Promise<string>;

/** The minimum's compare-and-delete. */
const compareAndDelete = await load(
  "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0",
);
/** The take in a script of its own, nothing else: what calling a script costs. */
const scriptedSet = await load(
  "if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return 1 end return 0",
);
/** A fence from a counter alone (the library before its clock-based fences, stop 33). */
const counterFence = await load(`
if not redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return 0 end
local fence = redis.call('INCRBY', KEYS[2], ${FENCE_STRIDE})
redis.call('PEXPIRE', KEYS[2], ARGV[3])
return fence`);
const acquire = await load(ACQUIRE_SCRIPT);
/**
 * The release as the unbuilt announcement cut would make it (issue "Less work for Redis per
 * lock"): the queue read, and no `PUBLISH` when nobody is queued. A measure of what the cut could
 * save, not a release the library could send today: waiters that do not join the queue (own
 * tokens, readers, other shapes) would not be woken.
 */
const quietRelease = await load(`
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1], KEYS[2])
if not redis.call('ZRANGE', KEYS[3], 0, 1)[1] then return 1 end
return 1 + redis.call('PUBLISH', ARGV[2], ARGV[3])`);
const release = await load(RELEASE_SCRIPT);
/** `script` with `from` replaced by `to` (exactly once: else the row would measure nothing). */
function cut(script: string, from: string, to: string): string {
  const parts = script.split(from);
  if (parts.length !== 2) throw new Error(`the cut's text appears ${parts.length - 1} times`);
  return parts.join(to);
}
/**
 * The release cut (issue "Less work for Redis per lock"): for a generated token, the lock key
 * alone deleted, not the own token's fence record beside it (a generated token has none).
 */
const releaseKeyAlone = await load(
  cut(RELEASE_SCRIPT, "redis.call('DEL', KEYS[1], KEYS[2])", "redis.call('DEL', KEYS[1])"),
);
const extend = await load(EXTEND_SCRIPT);
/** The extension cut: no `PEXPIRE` of the own token's fence record where there is none. */
const extendLockAlone = await load(
  cut(EXTEND_SCRIPT, "redis.call('PEXPIRE', KEYS[3], ARGV[2])\n", ''),
);
const processId = randomBytes(8).toString('base64url');
const TTL = 10_000;
/** The counter's TTL as the library sends it: the lock's TTL + the default fence retention. */
const COUNTER_TTL = TTL + 60_000;
const QUEUE_STAY = 4_100;

/** Each step must have done what it says (taken the free key, released it): else the run stops. */
function took(reply: unknown, what: string): void {
  if (typeof reply !== 'number' ? reply !== 'OK' : reply < 1) {
    throw new Error(`${what} answered ${String(reply)}: the key was not free, or not ours`);
  }
}

const key = (i: number): string => `cost:{k${i % 10}}`;
const ours = async (i: number, token: string): Promise<void> =>
  took(
    await client.evalsha(
      acquire,
      3,
      key(i),
      'cost:{}:counter',
      `${key(i)}:turns`,
      token,
      TTL,
      COUNTER_TTL,
      QUEUE_STAY,
      processId,
    ),
    'our acquire script',
  );
/** A release by `script` (ours, or the cut's), its queue arguments `queue` (see NAME_NEXT). */
const releaseBy = async (
  script: string,
  i: number,
  token: string,
  ...queue: string[]
): Promise<void> =>
  took(
    await client.evalsha(
      script,
      3,
      key(i),
      `${key(i)}:fence`,
      `${key(i)}:turns`,
      token,
      `${key(i)}:released`,
      '',
      ...queue,
    ),
    script === release ? 'our release script' : 'a cut release script',
  );
const announce = (i: number, token: string, ...queue: string[]): Promise<void> =>
  releaseBy(release, i, token, ...queue);
/** An extension by `script` (ours, or the cut's) of a generated token's lock. */
const extendBy = async (script: string, i: number, token: string): Promise<void> =>
  took(
    await client.evalsha(
      script,
      3,
      key(i),
      'cost:{}:counter',
      `${key(i)}:fence`,
      token,
      TTL,
      COUNTER_TTL,
    ),
    script === extend ? 'our extension script' : 'the cut extension script',
  );
const unlock = async (i: number, token: string): Promise<void> =>
  took(await client.evalsha(compareAndDelete, 1, key(i), token), 'compare-and-delete');

Logger.overrideLogger(false);
const locks = new LockService({ client, keyPrefix: 'lib:' });

interface Row {
  name: string;
  pair(i: number): Promise<void>;
}
const ROWS: Row[] = [
  {
    name: 'hand-written minimum: SET NX PX, compare-and-delete script',
    async pair(i) {
      const token = freshToken();
      took(await client.set(key(i), token, 'PX', TTL, 'NX'), 'SET NX');
      await unlock(i, token);
    },
  },
  {
    name: 'the SET NX PX inside a script',
    async pair(i) {
      const token = freshToken();
      took(await client.evalsha(scriptedSet, 1, key(i), token, TTL), 'the scripted SET NX');
      await unlock(i, token);
    },
  },
  {
    name: '+ a fence from a counter (INCRBY, PEXPIRE)',
    async pair(i) {
      const token = freshToken();
      took(
        await client.evalsha(counterFence, 2, key(i), 'cost:{}:counter', token, TTL, COUNTER_TTL),
        'the counter fence script',
      );
      await unlock(i, token);
    },
  },
  {
    name: "+ the fence from the server's clock (our acquire script)",
    async pair(i) {
      const token = freshToken();
      await ours(i, token);
      await unlock(i, token);
    },
  },
  {
    name: '+ the release announced to waiters (our release script, PUBLISH)',
    async pair(i) {
      const token = freshToken();
      await ours(i, token);
      await announce(i, token);
    },
  },
  {
    name: '+ the next process named from the queue (ZRANGE): what the library sends',
    async pair(i) {
      const token = freshToken();
      await ours(i, token);
      await announce(i, token, processId);
    },
  },
  {
    name: '… announced only when someone is queued (the unbuilt cut; not safe today)',
    async pair(i) {
      const token = freshToken();
      await ours(i, token);
      await releaseBy(quietRelease, i, token);
    },
  },
  {
    name: '… the release deleting the lock key alone (the generated-token cut)',
    async pair(i) {
      const token = freshToken();
      await ours(i, token);
      await releaseBy(releaseKeyAlone, i, token, processId);
    },
  },
  {
    name: 'what the library sends, with an extension between (3 commands)',
    async pair(i) {
      const token = freshToken();
      await ours(i, token);
      await extendBy(extend, i, token);
      await announce(i, token, processId);
    },
  },
  {
    name: '… the extension without the record’s PEXPIRE (the extension cut)',
    async pair(i) {
      const token = freshToken();
      await ours(i, token);
      await extendBy(extendLockAlone, i, token);
      await announce(i, token, processId);
    },
  },
  {
    name: 'the library: LockService.acquire + release',
    async pair(i) {
      const lock = await locks.acquire(`k${i % 10}`, { ttl: TTL });
      took((await lock.release()) ? 1 : 0, 'LockHandle.release');
    },
  },
];

async function serverCpuUs(): Promise<number> {
  const info = await admin.info('cpu');
  const field = (name: string): number => Number(new RegExp(`${name}:([\\d.]+)`).exec(info)![1]);
  return (field('used_cpu_user') + field('used_cpu_sys')) * 1e6;
}

async function commandUs(): Promise<number> {
  const info = await admin.info('commandstats');
  let total = 0;
  for (const [, name, usec] of info.matchAll(/cmdstat_(\w+):calls=\d+,usec=(\d+)/g)) {
    if (name !== 'info' && name !== 'config') total += Number(usec);
  }
  return total;
}

interface Measure {
  pairsPerSec: number;
  wallUs: number;
  clientUs: number;
  serverUs: number;
  commandUs: number;
}

async function measure(row: Row): Promise<Measure> {
  for (let i = 0; i < Math.min(1_000, pairs); i++) await row.pair(i); // warm up
  await admin.config('RESETSTAT');
  const server0 = await serverCpuUs();
  const cpu0 = process.cpuUsage();
  const start = performance.now();
  for (let i = 0; i < pairs; i++) await row.pair(i);
  const wallMs = performance.now() - start;
  const cpu = process.cpuUsage(cpu0);
  const serverUs = (await serverCpuUs()) - server0;
  return {
    pairsPerSec: (pairs * 1_000) / wallMs,
    wallUs: (wallMs * 1_000) / pairs,
    clientUs: (cpu.user + cpu.system) / pairs,
    serverUs: serverUs / pairs,
    commandUs: (await commandUs()) / pairs,
  };
}

const results = ROWS.map(() => [] as (Measure & { ratio: number })[]);
for (let round = 0; round < rounds; round++) {
  const measured = new Map<number, Measure>();
  for (let n = 0; n < ROWS.length; n++) {
    const index = (n + round) % ROWS.length;
    measured.set(index, await measure(ROWS[index]));
  }
  const minimum = measured.get(0)!.pairsPerSec;
  for (const [index, m] of measured) results[index].push({ ...m, ratio: m.pairsPerSec / minimum });
  process.stderr.write(`round ${round + 1} of ${rounds} done\n`);
}
const median = (values: number[]): number => percentile(values, 50);
const lines = [
  `${pairs.toLocaleString('en')} sequential pairs per row and round, ${rounds} rounds, medians:`,
  '',
  '| commands | pairs/s vs minimum | wall µs per pair | client CPU µs | Redis CPU µs | Redis command time µs |',
  '| --- | --- | --- | --- | --- | --- |',
  ...ROWS.map((row, index) => {
    const of = (field: keyof Measure | 'ratio'): number =>
      median(results[index].map((m) => m[field]));
    return `| ${row.name} | ${of('ratio').toFixed(2)}× | ${of('wallUs').toFixed(0)} | ${of('clientUs').toFixed(0)} | ${of('serverUs').toFixed(0)} | ${of('commandUs').toFixed(1)} |`;
  }),
];
process.stdout.write(`${lines.join('\n')}\n`);
await locks.onApplicationShutdown();
client.disconnect();
admin.disconnect();
await server.stop();
