/**
 * Fair locks' scripts: a FIFO queue of waiters under the lock's key, whose first is the only one
 * that may take a free key. Atomic as every lock script: the queue check and the grant are one step.
 */
import {
  ANNOUNCE,
  MARK_WRITER,
  NEXT_FENCE,
  RECORD_OWN,
  RENEW_OWN,
  SCAN_READERS,
} from './lock.scripts.js';

/**
 * Fair locks queue their waiters under the lock's key: KEYS[3] the queue (sorted set: token →
 * arrival, the server's clock in µs), KEYS[4] when each waiter stops counting (sorted set: token →
 * server ms). A waiter renews its place with every attempt; one that stopped asking (gave up
 * without leaving, or died) is dropped once that time passes, so it never blocks the queue for
 * longer. This snippet drops them and leaves `now` (ms) and `clock`.
 */
export const DROP_GONE_WAITERS = `
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
local gone = redis.call('ZRANGEBYSCORE', KEYS[4], '-inf', now)
for _, waiter in ipairs(gone) do redis.call('ZREM', KEYS[3], waiter) end
if #gone > 0 then redis.call('ZREMRANGEBYSCORE', KEYS[4], '-inf', now) end
`;

/**
 * Fair (FIFO) lock. KEYS[1] lock key, KEYS[2] fence counter, KEYS[3] queue, KEYS[4] waiters' stay,
 * KEYS[5] an own token's fence record (see RENEW_OWN); ARGV[1] token, ARGV[2] ttl ms, ARGV[3] fence
 * counter TTL ms, ARGV[4] how long a waiter's place lasts without another attempt (ms), ARGV[5]
 * '1' for the caller's own token (its fence is recorded). The lock goes only to the head of the
 * queue (or to anyone when nobody queues): a newcomer that will wait (ARGV[4] > 0) joins the tail,
 * one that will not (`tryAcquire`) takes no place, and neither takes a free key ahead of those who
 * came first. Returns the fence, or -2 - the holder's remaining TTL (-1 without one), or 0 (free,
 * but not this waiter's turn: it retries when woken or after its pause).
 */
export const ACQUIRE_FAIR_SCRIPT = `
${DROP_GONE_WAITERS}
local holder = redis.pcall('GET', KEYS[1])
if holder == ARGV[1] then
  ${RENEW_OWN('KEYS[5]')}
else
  local busy
  if redis.call('TYPE', KEYS[1]).ok == 'hash' then
    -- Read locks: a fair writer marks them as any waiting writer does (see MARK_WRITER).
    ${SCAN_READERS}
    busy = readers > 0
    if busy and tonumber(ARGV[4]) > 0 then ${MARK_WRITER('ARGV[4]')} end
  else
    busy = redis.call('EXISTS', KEYS[1]) == 1
  end
  local head = redis.call('ZRANGE', KEYS[3], 0, 0)[1]
  if busy or (head and head ~= ARGV[1]) then
    -- A caller that will not wait (tryAcquire) takes no place.
    if tonumber(ARGV[4]) > 0 then
      redis.call('ZADD', KEYS[3], 'NX', tonumber(clock[1]) * 1000000 + tonumber(clock[2]), ARGV[1])
      redis.call('ZADD', KEYS[4], now + tonumber(ARGV[4]), ARGV[1])
      for i = 3, 4 do
        if redis.call('PTTL', KEYS[i]) < tonumber(ARGV[4]) then redis.call('PEXPIRE', KEYS[i], ARGV[4]) end
      end
    end
    if not busy then return 0 end
    local pttl = redis.call('PTTL', KEYS[1])
    if pttl < 0 then return -1 end
    return -2 - pttl
  end
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  redis.call('ZREM', KEYS[3], ARGV[1])
  redis.call('ZREM', KEYS[4], ARGV[1])
end
${NEXT_FENCE(
  'ARGV[3]',
  1,
  `
if ARGV[5] == '1' then ${RECORD_OWN('KEYS[5]')} end`,
)}`;

/**
 * KEYS[1] lock key, KEYS[2] an own token's fence record, KEYS[3] queue, KEYS[4] stay; ARGV[1]
 * token, ARGV[2] message,
 * ARGV[3] 1 to release the lock, 0 for a waiter leaving the queue, ARGV[4] the turn channels'
 * prefix, `<lock key>:fair:` as the client names it (not from KEYS[1], which a client's own ioredis
 * `keyPrefix` prefixes, while channels it subscribes to are not). Tells the head of the queue (on
 * its own channel, ARGV[4] .. token) that it is its turn: after a release, or when a waiter leaves
 * while the key is free. Returns 0 if ARGV[1] did not hold the lock (release), else 1 + the
 * subscribers reached.
 */
const fairRelease = (publish: 'PUBLISH' | 'SPUBLISH'): string => `
if ARGV[3] == '1' then
  if redis.pcall('GET', KEYS[1]) ~= ARGV[1] then return 0 end
  redis.call('DEL', KEYS[1], KEYS[2])
else
  redis.call('ZREM', KEYS[3], ARGV[1])
  redis.call('ZREM', KEYS[4], ARGV[1])
  -- A fair writer waiting on read locks takes back its mark (see MARK_WRITER).
  if redis.call('TYPE', KEYS[1]).ok == 'hash' then redis.call('HDEL', KEYS[1], '') end
  if redis.call('EXISTS', KEYS[1]) == 1 then return 1 end
end
${DROP_GONE_WAITERS}
local head = redis.call('ZRANGE', KEYS[3], 0, 0)[1]
if not head then return 1 end${ANNOUNCE(publish, 'ARGV[4] .. head', 'ARGV[2]')}
`;
export const RELEASE_FAIR_SCRIPT = fairRelease('PUBLISH');
export const RELEASE_FAIR_SHARDED_SCRIPT = fairRelease('SPUBLISH');
