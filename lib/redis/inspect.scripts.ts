import { NOW } from './election.scripts.js';
import { DROP_GONE_WAITERS } from './fair.scripts.js';
import { FENCE_OF } from './lock.scripts.js';

/**
 * What holds a lock, for an operator (`LockService.inspect()`). KEYS: lock, own fence record,
 * queue of waiting processes, a fair lock's waiters' stay. Reply: `{ kind, holders, ttlLeft,
 * fence, waiting, token }`: `kind` the lock key's type (`none`, `string` a plain or write lock,
 * `zset` a semaphore's places, `hash` read locks); `holders` the live holders; `ttlLeft` ms until
 * the last of them runs out; `fence` an own token's recorded fence (-1: none recorded; a generated
 * token's fence is not stored); `waiting` the processes queued for a plain lock (one per process),
 * the live waiters of a fair lock, and a writer waiting on readers (1); `token` the plain lock's
 * holder (compared between Redlock's nodes, never shown).
 */
export const INSPECT_SCRIPT = `${NOW}
local kind = redis.call('TYPE', KEYS[1]).ok
local holders, ttlLeft, fence, waiting, token = 0, 0, -1, 0, ''
if kind == 'string' then
  holders = 1
  ttlLeft = redis.call('PTTL', KEYS[1])
  token = redis.call('GET', KEYS[1])
  local record = redis.call('GET', KEYS[2])
  if record then fence = tonumber((string.gsub(record, '^~', ''))) end
elseif kind == 'zset' then
  holders = redis.call('ZCOUNT', KEYS[1], '(' .. now, '+inf')
  local last = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
  if last[2] and holders > 0 then ttlLeft = tonumber(last[2]) - now end
elseif kind == 'hash' then
  local fields = redis.call('HGETALL', KEYS[1])
  for i = 1, #fields, 2 do
    local expiry = tonumber(fields[i + 1])
    if expiry > now then
      if fields[i] == '' then
        waiting = waiting + 1
      else
        holders = holders + 1
        if expiry - now > ttlLeft then ttlLeft = expiry - now end
      end
    end
  end
  if holders == 0 then kind = 'none' end
end
if kind == 'string' or kind == 'none' then
  waiting = waiting + redis.call('ZCARD', KEYS[3]) + redis.call('ZCOUNT', KEYS[4], '(' .. now, '+inf')
end
if holders == 0 then kind = 'none' end
return { kind, holders, ttlLeft, string.format('%.0f', fence), waiting, token }
`;

/**
 * An operator frees a lock whatever holds it (`LockService.forceRelease()`; never run by the
 * library itself). KEYS: lock, own fence record, a fair lock's queue and its waiters' stay, the
 * fences of a semaphore's or read lock's own tokens, the fence counter; ARGV[1] the release
 * channel, ARGV[2] the fair turn channels' prefix (see `RELEASE_FAIR_SCRIPT`), ARGV[3] the fence
 * counter's TTL; in Redlock mode ARGV[4] and ARGV[5]: a token and TTL the force holds the key with
 * itself meanwhile (see `RedlockBackend.forceRelease`), announcing nothing (its release does).
 * Deletes the lock key (a plain, fair or write lock; a semaphore's places; every
 * read lock, keeping a waiting writer's live mark, for as long as it lives, so that the writer
 * comes first) and the fence
 * records of own tokens, then announces a release as a holder's does: to every process's waiters,
 * and to the head of a fair queue. And takes a fence of its own from the counter (see `FENCE_OF`):
 * above every fence a holder it freed has (or an in-process heir of one takes), below every later
 * holder's, so that a fenced store told it refuses every freed holder. Returns `{ kind, holders,
 * fence }` (see `INSPECT_SCRIPT`): what it freed.
 */
const forceRelease = (publish: 'PUBLISH' | 'SPUBLISH'): string => `${FENCE_OF('KEYS[6]', 'ARGV[3]')}
${NOW}
local kind = redis.call('TYPE', KEYS[1]).ok
local holders = 0
if kind == 'string' then
  holders = 1
  redis.call('DEL', KEYS[1])
elseif kind == 'zset' then
  holders = redis.call('ZCOUNT', KEYS[1], '(' .. now, '+inf')
  redis.call('DEL', KEYS[1])
elseif kind == 'hash' then
  local fields = redis.call('HGETALL', KEYS[1])
  local mark = 0
  for i = 1, #fields, 2 do
    if fields[i] ~= '' then
      if tonumber(fields[i + 1]) > now then holders = holders + 1 end
      redis.call('HDEL', KEYS[1], fields[i])
    else
      mark = tonumber(fields[i + 1])
    end
  end
  -- What is left is a waiting writer's mark: it lives as long as the mark, not as the readers.
  if mark > now then redis.call('PEXPIRE', KEYS[1], mark - now) else redis.call('DEL', KEYS[1]) end
end
redis.call('DEL', KEYS[2], KEYS[5])
local freed = string.format('%.0f', fence)
if ARGV[4] then
  redis.call('SET', KEYS[1], ARGV[4], 'PX', ARGV[5])
  return { kind, holders, freed }
end
if holders == 0 then return { kind, 0, freed } end
${DROP_GONE_WAITERS}
local head = redis.call('ZRANGE', KEYS[3], 0, 0)[1]
if head then redis.pcall('${publish}', ARGV[2] .. head, '') end
redis.pcall('${publish}', ARGV[1], '')
return { kind, holders, freed }
`;
export const FORCE_RELEASE_SCRIPT = forceRelease('PUBLISH');
/** On a Cluster of Redis >= 7 (see `RELEASE_SHARDED_SCRIPT`). */
export const FORCE_RELEASE_SHARDED_SCRIPT = forceRelease('SPUBLISH');
