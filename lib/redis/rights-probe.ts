import type { Cluster, Redis } from 'ioredis';
import { within } from '../utils/within.js';

/**
 * KEYS[1..3] a probe lock key, a sorted set and a hash beside it (one hash tag: one slot), KEYS[4]
 * the fence counter of the probe's slot (shared with real locks); ARGV[1] the probe's release
 * channel, ARGV[2] PUBLISH or SPUBLISH. Runs every command the lock scripts run, on the probe's
 * keys, through `pcall`, and deletes them; on the counter, what the scripts run there, changing
 * nothing (its own value written back, a TTL only ever lengthened, and never by 1 ms): returns
 * the commands Redis refused (ACL: the command, or the keys) with its words, and 1 if it refused
 * to publish.
 */
const PROBE_SCRIPT = `
local refused = {}
local function try(name, ...)
  local reply = redis.pcall(name, ...)
  if type(reply) == 'table' and reply.err then
    table.insert(refused, name .. ': ' .. reply.err)
  end
end
try('TIME')
try('SET', KEYS[1], '1', 'PX', 1000)
try('GET', KEYS[1])
try('PEXPIRE', KEYS[1], 1000)
try('PTTL', KEYS[1])
try('TYPE', KEYS[1])
try('EXISTS', KEYS[1])
try('DEL', KEYS[1])
try('ZADD', KEYS[2], 1, 'p')
try('ZSCORE', KEYS[2], 'p')
try('ZRANGE', KEYS[2], 0, 0)
try('ZRANGEBYSCORE', KEYS[2], '-inf', '+inf')
try('ZCARD', KEYS[2])
try('ZREMRANGEBYSCORE', KEYS[2], '-inf', 0)
try('ZREM', KEYS[2], 'p')
try('HSET', KEYS[3], 'p', '1')
try('HGET', KEYS[3], 'p')
try('HGETALL', KEYS[3])
try('HDEL', KEYS[3], 'p')
local counter = redis.pcall('GET', KEYS[4])
if type(counter) == 'table' and counter.err then
  table.insert(refused, 'GET (fence counter): ' .. counter.err)
else
  try('SET', KEYS[4], counter or '0', 'XX', 'KEEPTTL')
  try('PEXPIRE', KEYS[4], 1, 'GT')
end
redis.pcall('DEL', KEYS[1], KEYS[2], KEYS[3])
local heard = redis.pcall(ARGV[2], ARGV[1], '')
return { table.concat(refused, '\\n'), type(heard) == 'table' and 1 or 0 }`;

/** What the Redis user may not do, as `probeRights` found. */
export interface Rights {
  /** What Redis refused, one entry per command (`ZADD: <Redis's words>`); empty when all ran. */
  readonly refused: readonly string[];
  /** Whether Redis refused to publish on the lock's channels. */
  readonly channelRefused: boolean;
}

/**
 * Startup: whether the Redis user may do what the locks need, asked once within `commandTimeout`
 * (`undefined` if Redis does not answer in time, or fails otherwise: the first lock tells then).
 * The module's own commands are asked too: `EVALSHA` (every lock; a refused script load is named
 * as such), and, inside the probe, what the scripts run (Redis checks a script's commands and keys
 * against the user as well). `SUBSCRIBE` cannot be asked without subscribing: a refused
 * subscription is said when it happens.
 */
export async function probeRights(
  client: Redis | Cluster,
  keys: readonly [string, string, string, counter: string],
  channel: string,
  publish: 'PUBLISH' | 'SPUBLISH',
  commandTimeout: number,
): Promise<Rights | undefined> {
  const evalsha = client.evalsha('0'.repeat(40), 0).then(
    () => undefined,
    (error: Error) => (/NOSCRIPT/.test(error.message) ? undefined : `EVALSHA: ${error.message}`),
  );
  const probe = client.eval(PROBE_SCRIPT, 4, ...keys, channel, publish) as Promise<
    [string, number]
  >;
  try {
    const [shaRefused, [refused, channelRefused]] = await within(
      Promise.all([evalsha, probe]),
      commandTimeout,
      [],
    );
    const all = refused === '' ? [] : refused.split('\n');
    return {
      refused: shaRefused ? [shaRefused, ...all] : all,
      channelRefused: channelRefused === 1,
    };
  } catch (error) {
    // EVAL itself refused: the scripts cannot run at all.
    if (error instanceof Error && /NOPERM|no permissions/i.test(error.message)) {
      return { refused: [`EVAL: ${error.message}`], channelRefused: false };
    }
    return undefined;
  }
}
