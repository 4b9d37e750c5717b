/**
 * The Lua scripts behind every lock operation. Each runs as one atomic step inside Redis, so no
 * other client can observe or act between its check of the owner token and its write. Keys are
 * always passed in KEYS (never spliced into the text), so the scripts work on every cluster node:
 * the lock key and its fence key share a hash tag, hence a slot.
 */

/**
 * KEYS[1] lock key, KEYS[2] fence key; ARGV[1] token, ARGV[2] ttl ms, ARGV[3] fence retention ms.
 * Returns one integer (one reply to decode, not an array): the fence (> 0) when the caller holds
 * the lock afterwards; when someone else does, -2 - the holder's remaining TTL in ms (or -1 when
 * that lock has no TTL).
 *
 * The fence is the counter's last value + 1 while the counter key lives (it outlives the lock by
 * the fence retention), so strictly increasing; when the counter is gone it restarts from the
 * server's TIME in microseconds, which is still greater than every earlier fence unless the server
 * clock went back by more than the time since the counter was last written. A free key costs
 * SET NX + INCR + PEXPIRE (TIME and SET instead of PEXPIRE when the counter is new).
 */
export const ACQUIRE_SCRIPT = `
if not redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  if redis.call('GET', KEYS[1]) ~= ARGV[1] then
    local pttl = redis.call('PTTL', KEYS[1])
    if pttl < 0 then return -1 end
    return -2 - pttl
  end
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  local held = redis.call('GET', KEYS[2])
  if held then
    redis.call('PEXPIRE', KEYS[2], ARGV[2] + ARGV[3])
    return tonumber(held)
  end
end
local fence = redis.call('INCR', KEYS[2])
if fence == 1 then
  local now = redis.call('TIME')
  fence = tonumber(now[1]) * 1000000 + tonumber(now[2])
  redis.call('SET', KEYS[2], string.format('%.0f', fence), 'PX', ARGV[2] + ARGV[3])
else
  redis.call('PEXPIRE', KEYS[2], ARGV[2] + ARGV[3])
end
return fence
`;

/**
 * KEYS[1] lock key, KEYS[2] fence key; ARGV[1] token, ARGV[2] ttl ms, ARGV[3] fence retention ms.
 * Returns 1 if the token still held the lock and its TTL was reset, 0 otherwise. Never creates a
 * lock that is gone.
 */
export const EXTEND_SCRIPT = `
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
redis.call('PEXPIRE', KEYS[2], ARGV[2] + ARGV[3])
return 1
`;

/**
 * KEYS[1] lock key; ARGV[1] token, ARGV[2] release channel.
 * Deletes the lock only if the token still holds it, and announces the release to waiters in the
 * same step. Returns 1 if deleted, 0 if the lock was no longer this token's.
 */
export const RELEASE_SCRIPT = `
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1])
redis.call('PUBLISH', ARGV[2], '')
return 1
`;
