/**
 * An election's record, for anyone to read (`LockService.leader()`, `participants()`), beside the
 * leader lock `P{K}` (see `KeyLayout.electionKeys`):
 *
 * - `P{K}:leader`, a hash: the current (or last) term's `token`, participant `id`, `fence`,
 *   `since` (when its term began, Redis's clock, ms) and `ttl` (its lease's), and `transitions`,
 *   how many terms began. Written when a term begins, by its leader, only while its token holds
 *   the lock; a record whose token no longer holds it names nobody. Kept for `keep` ms after the
 *   last term began or the last participant said it campaigns.
 * - `P{K}:participants`, a sorted set: an entry per campaign, `<its own random part>:<id>` (two
 *   campaigns may share an id: one that stops leaves the other listed), scored by when its stay
 *   runs out (Redis's clock, ms); renewed by each campaign every third of its TTL, removed when it
 *   stops, and gone with its last member.
 *
 * Both are read and written with Redis's clock (`TIME`), so that no two processes' clocks meet.
 */

/** Redis's clock in ms, as the Lua variable `now`. */
export const NOW = `
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)`;

/** Whether `token` (a Lua expression) holds the plain lock `KEYS[1]`, as the Lua variable `holds`. */
const HOLDS = (token: string): string => `
local holds = redis.call('TYPE', KEYS[1]).ok == 'string' and redis.call('GET', KEYS[1]) == ${token}`;

/** Keeps the record `KEYS[2]`, if there is one, for at least `ARGV[n]` ms more. */
const KEEP_RECORD = (n: number): string => `
local left = redis.call('PTTL', KEYS[2])
if left ~= -2 and left < tonumber(ARGV[${n}]) then redis.call('PEXPIRE', KEYS[2], ARGV[${n}]) end`;

/**
 * A term is on. KEYS: lock, record. ARGV: token, id, fence, ttl, keep, and the least count of
 * transitions a new term gives (Redlock mode: one more than a majority's record showed, so that
 * a node that was away for some terms catches up; else 0). Sent when the term begins
 * and again with each renewal of the leader's stay, so that a Redlock node that got the lock's
 * copy only later (written back by an extension) gets the record too: a term already recorded
 * (its token in the record) is only kept; a new one is written, with its start and one more
 * transition. 1 if recorded; 0 if the token does not hold the lock (the term is over, or this
 * node has no copy of it yet: nothing is written).
 */
export const RECORD_TERM_SCRIPT = `${HOLDS('ARGV[1]')}
if not holds then return 0 end
if redis.call('HGET', KEYS[2], 'token') ~= ARGV[1] then${NOW}
  redis.call('HSET', KEYS[2], 'token', ARGV[1], 'id', ARGV[2], 'fence', ARGV[3], 'since', now, 'ttl', ARGV[4])
  if redis.call('HINCRBY', KEYS[2], 'transitions', 1) < tonumber(ARGV[6]) then
    redis.call('HSET', KEYS[2], 'transitions', ARGV[6])
  end
end${KEEP_RECORD(5)}
return 1
`;

/**
 * A campaign's entry stays `stay` more ms, or (stay 0) goes: it stopped. KEYS: participants,
 * record. ARGV: entry, stay, keep. The set expires with its last member's stay.
 */
export const PARTICIPATE_SCRIPT = `${NOW}
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if ARGV[2] == '0' then
  redis.call('ZREM', KEYS[1], ARGV[1])
else
  redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[1])
  ${KEEP_RECORD(3).trim().replace(/\n/g, '\n  ')}
end
local last = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
if last[2] then redis.call('PEXPIREAT', KEYS[1], last[2]) end
return 1
`;

/**
 * Who leads. KEYS: lock, record, participants. ARGV: 1 to list the participants. Reply:
 * `{ leads, id, fence, since, ttl, ttlLeft, transitions, now, participant... }`: `leads` 1 when the
 * record's token holds the lock (then `ttlLeft` is the lock's PTTL); the participants whose stay
 * has not run out, when asked.
 */
export const ELECTION_SCRIPT = `
local record = redis.call('HMGET', KEYS[2], 'token', 'id', 'fence', 'since', 'ttl', 'transitions')${NOW}
local leads = 0
local ttlLeft = -2
if record[1] then${HOLDS('record[1]').replace(/\n/g, '\n  ')}
  if holds then
    leads = 1
    ttlLeft = redis.call('PTTL', KEYS[1])
  end
end
local reply = { leads, record[2] or '', record[3] or '0', record[4] or '0', record[5] or '0', ttlLeft, record[6] or '0', now }
if ARGV[1] == '1' then
  for _, id in ipairs(redis.call('ZRANGEBYSCORE', KEYS[3], '(' .. now, '+inf')) do reply[#reply + 1] = id end
end
return reply
`;
