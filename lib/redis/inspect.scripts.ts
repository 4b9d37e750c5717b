import { NOW } from './election.scripts.js';

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
