/**
 * The scripts of the lock shapes that admit several holders of one key: counting semaphores
 * (`limit` > 1) and read locks (`mode: 'read'`). Their holders are a sorted set under the lock's
 * key, each token scored with its expiry on the Redis server's clock. Atomic as every lock script:
 * the check of the holders and the write are one step. See `lock.scripts.ts` for the fences.
 */
import { ANNOUNCE, FENCE_OF, KEEP_COUNTER, NEXT_FENCE, SCAN_READERS } from './lock.scripts.js';

/**
 * The Redis server's clock in ms (a semaphore holder's expiry is scored on it: no client clock is
 * ever compared), then the holders whose lease ran out are dropped (KEYS[1], a sorted set).
 */
const NOW_AND_PURGE = `
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
`;

/** The set's own TTL follows its longest-living holder, so it vanishes with the last lease. */
const KEEP_SET_TTL = `
local last = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
if last[2] then redis.call('PEXPIRE', KEYS[1], tonumber(last[2]) - now) end
`;

/** Lengthens KEYS[3] (the own tokens' fences) to at least ARGV[2] ms (this holder's TTL). */
const KEEP_OWN_FENCES = `
if redis.call('PTTL', KEYS[3]) < tonumber(ARGV[2]) then redis.call('PEXPIRE', KEYS[3], ARGV[2]) end`;

/**
 * The fence of a semaphore place or read lock, as the scripts' last step. KEYS[3] keeps, for the
 * callers' own tokens (`own`, a Lua expression, true), the fence each holds (hash: token → fence),
 * so that re-acquiring with an own token that holds a place returns the same fence (`had`: it held
 * one before this call), as it does for a plain lock. Generated tokens never come back, and pay
 * nothing. The hash lives as long as its longest holder (ARGV[2]); a stale entry is overwritten by
 * the token's next new place.
 */
const SHARED_FENCE = (had: string, own: string): string => `
if ${own} then
  if ${had} then
    local kept = redis.call('HGET', KEYS[3], ARGV[1])
    if kept then${KEEP_COUNTER('KEYS[2]', 'ARGV[3]')}
      ${KEEP_OWN_FENCES}
      return tonumber(kept)
    end
  end
  ${FENCE_OF('KEYS[2]', 'ARGV[3]')}
  redis.call('HSET', KEYS[3], ARGV[1], string.format('%.0f', fence))
  ${KEEP_OWN_FENCES}
  return fence
end
${NEXT_FENCE('ARGV[3]')}`;

/**
 * Counting semaphore. KEYS[1] holders (sorted set: token → expiry, server ms), KEYS[2] fence counter,
 * KEYS[3] own tokens' fences (see SHARED_FENCE); ARGV[1] token, ARGV[2] ttl ms, ARGV[3] fence
 * counter TTL ms, ARGV[4] limit, ARGV[5] '1' for the caller's own token.
 * Takes a place if fewer than `limit` live holders have one (or the token has one already: its
 * lease is renewed), with a new fence (an own token that has a place keeps its fence); else
 * returns -2 - the ms until the first lease runs out. A plain lock on the key (a string) excludes
 * every semaphore caller, as it excludes everyone.
 */
export const ACQUIRE_SEMAPHORE_SCRIPT = `
local kind = redis.call('TYPE', KEYS[1]).ok
if kind == 'hash' then
  ${SCAN_READERS}
  if readers > 0 then return -2 - (last - now) end
  redis.call('DEL', KEYS[1])
elseif kind ~= 'none' and kind ~= 'zset' then
  local pttl = redis.call('PTTL', KEYS[1])
  if pttl < 0 then return -1 end
  return -2 - pttl
end
${NOW_AND_PURGE}
local had = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not had and redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[4]) then
  local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
  return -2 - (tonumber(first[2]) - now)
end
-- GT: a token that has a place already keeps the longer lease (a handle taken earlier keeps its).
redis.call('ZADD', KEYS[1], 'GT', now + tonumber(ARGV[2]), ARGV[1])
${KEEP_SET_TTL}
${SHARED_FENCE('had', "ARGV[5] == '1'")}`;

/**
 * KEYS[1] holders, KEYS[2] fence counter, KEYS[3] own tokens' fences; ARGV[1] token, ARGV[2] ttl ms,
 * ARGV[3] fence counter TTL ms. Renews the token's lease if it is still live; returns 1, or 0
 * (nothing changed: a lapsed place is never taken again by an extension).
 */
export const EXTEND_SEMAPHORE_SCRIPT = `
if redis.call('TYPE', KEYS[1]).ok ~= 'zset' then return 0 end
${NOW_AND_PURGE}
if not redis.call('ZSCORE', KEYS[1], ARGV[1]) then return 0 end
redis.call('ZADD', KEYS[1], 'XX', now + tonumber(ARGV[2]), ARGV[1])
${KEEP_SET_TTL}${KEEP_COUNTER('KEYS[2]', 'ARGV[3]')}
if redis.call('EXISTS', KEYS[3]) == 1 then ${KEEP_OWN_FENCES} end
return 1
`;

/**
 * KEYS[1] holders, KEYS[2] fence counter, KEYS[3] own tokens' fences; ARGV[1] token, ARGV[2] channel,
 * ARGV[3] message. Gives the token's place back and announces it (see `release`); 0 if it held
 * none (any more).
 */
const releaseSemaphore = (publish: 'PUBLISH' | 'SPUBLISH'): string => `
if redis.call('TYPE', KEYS[1]).ok ~= 'zset' then return 0 end
${NOW_AND_PURGE}
local held = redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('HDEL', KEYS[3], ARGV[1])
if redis.call('ZCARD', KEYS[1]) > 0 then
${KEEP_SET_TTL}
else
  redis.call('DEL', KEYS[3])
end
if held == 0 then return 0 end${ANNOUNCE(publish, 'ARGV[2]', 'ARGV[3]')}
`;
export const RELEASE_SEMAPHORE_SCRIPT = releaseSemaphore('PUBLISH');
export const RELEASE_SEMAPHORE_SHARDED_SCRIPT = releaseSemaphore('SPUBLISH');

/**
 * KEYS[1] lock key; ARGV[1] token. 1 if the token holds the key: as a plain lock's owner, with a
 * live place in a semaphore, or as a live reader. Changes nothing.
 */
export const IS_HELD_SCRIPT = `
local kind = redis.call('TYPE', KEYS[1]).ok
if kind == 'string' then
  if redis.call('GET', KEYS[1]) == ARGV[1] then return 1 end
  return 0
end
if kind == 'hash' then
  local clock = redis.call('TIME')
  local expiry = redis.call('HGET', KEYS[1], ARGV[1])
  if ARGV[1] ~= '' and expiry and tonumber(expiry) > tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000) then return 1 end
  return 0
end
if kind ~= 'zset' then return 0 end
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
local expiry = redis.call('ZSCORE', KEYS[1], ARGV[1])
if expiry and tonumber(expiry) > now then return 1 end
return 0
`;

/**
 * Read lock. KEYS[1] readers (hash, see SCAN_READERS), KEYS[2] fence counter, KEYS[3] own tokens'
 * fences (see SHARED_FENCE); ARGV[1] token, ARGV[2] ttl ms, ARGV[3] fence counter TTL ms, ARGV[4]
 * '1' for the caller's own token. Joins the readers (or renews the token's lease) with a new fence
 * (an own token already reading keeps its fence), unless a writer holds the key (or anything but
 * a read lock does: busy until its PTTL) or waits for it (busy until its mark lapses; a reader
 * already in may renew).
 */
export const ACQUIRE_READ_SCRIPT = `
local kind = redis.call('TYPE', KEYS[1]).ok
if kind ~= 'none' and kind ~= 'hash' then
  local pttl = redis.call('PTTL', KEYS[1])
  if pttl < 0 then return -1 end
  return -2 - pttl
end
${SCAN_READERS}
if writer and not mine then return -2 - (writer - now) end
local expiry = now + tonumber(ARGV[2])
-- A token reading already keeps the longer lease (a handle taken earlier keeps its).
if mine then expiry = math.max(expiry, tonumber(redis.call('HGET', KEYS[1], ARGV[1]))) end
redis.call('HSET', KEYS[1], ARGV[1], expiry)
if expiry > last then last = expiry end
redis.call('PEXPIRE', KEYS[1], last - now)
${SHARED_FENCE('mine', "ARGV[4] == '1'")}`;

/**
 * KEYS[1] readers, KEYS[2] fence counter, KEYS[3] own tokens' fences; ARGV[1] token, ARGV[2] ttl,
 * ARGV[3] counter TTL. 1 or 0.
 */
export const EXTEND_READ_SCRIPT = `
if redis.call('TYPE', KEYS[1]).ok ~= 'hash' then return 0 end
${SCAN_READERS}
if not mine then return 0 end
local expiry = now + tonumber(ARGV[2])
redis.call('HSET', KEYS[1], ARGV[1], expiry)
-- The hash lives as long as its longest field now: this reader's old expiry no longer counts (an
-- extension with a shorter TTL would keep the key after every lease in it had run out).
last = expiry
for i = 1, #fields, 2 do
  local other = tonumber(fields[i + 1])
  if fields[i] ~= ARGV[1] and other > last then last = other end
end
redis.call('PEXPIRE', KEYS[1], last - now)${KEEP_COUNTER('KEYS[2]', 'ARGV[3]')}
if redis.call('EXISTS', KEYS[3]) == 1 then ${KEEP_OWN_FENCES} end
return 1
`;

/**
 * KEYS[1] readers, KEYS[2] fence counter, KEYS[3] own tokens' fences; ARGV[1] token, ARGV[2] channel,
 * ARGV[3] message.
 */
const releaseRead = (publish: 'PUBLISH' | 'SPUBLISH'): string => `
if redis.call('TYPE', KEYS[1]).ok ~= 'hash' then return 0 end
${SCAN_READERS}
redis.call('HDEL', KEYS[1], ARGV[1])
redis.call('HDEL', KEYS[3], ARGV[1])
if readers - (mine and 1 or 0) == 0 then
  redis.call('DEL', KEYS[3])
  if writer then
    redis.call('PEXPIRE', KEYS[1], writer - now)
  else
    redis.call('DEL', KEYS[1])
  end
elseif mine then
  -- The hash lives as long as its longest field left (the released reader's no longer counts).
  local keep = 0
  for i = 1, #fields, 2 do
    local other = tonumber(fields[i + 1])
    if fields[i] ~= ARGV[1] and other > keep then keep = other end
  end
  redis.call('PEXPIRE', KEYS[1], keep - now)
end
if not mine then return 0 end${ANNOUNCE(publish, 'ARGV[2]', 'ARGV[3]')}
`;
export const RELEASE_READ_SCRIPT = releaseRead('PUBLISH');
export const RELEASE_READ_SHARDED_SCRIPT = releaseRead('SPUBLISH');
