/**
 * The Lua scripts behind every lock operation. Each runs as one atomic step inside Redis, so no
 * other client can observe or act between its check of the owner token and its write. Keys are
 * always passed in KEYS (never spliced into the text), so the scripts work on every cluster node:
 * the lock key and its fence key share a hash tag, hence a slot.
 */

/** How long the fence counter outlives the last acquisition or extension of its lock, in ms. */
export const FENCE_RETENTION_MS = 24 * 60 * 60 * 1000;

/**
 * KEYS[1] lock key, KEYS[2] fence key; ARGV[1] token, ARGV[2] ttl ms, ARGV[3] fence retention ms.
 * Returns {1, fence} when the caller holds the lock afterwards, {0, pttl} when someone else does.
 *
 * The fence is max(last fence + 1, server TIME in microseconds): strictly increasing while the
 * counter key lives, and still increasing after it is gone as long as the server clock has not
 * gone back by more than the time since the last acquisition.
 */
export const ACQUIRE_SCRIPT = `
local holder = redis.call('GET', KEYS[1])
if holder == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  local fence = redis.call('GET', KEYS[2])
  if fence then
    redis.call('PEXPIRE', KEYS[2], ARGV[2] + ARGV[3])
    return {1, tonumber(fence)}
  end
elseif holder then
  return {0, redis.call('PTTL', KEYS[1])}
end
local now = redis.call('TIME')
local fence = math.max(tonumber(redis.call('GET', KEYS[2]) or '0') + 1,
                       tonumber(now[1]) * 1000000 + tonumber(now[2]))
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
redis.call('SET', KEYS[2], string.format('%.0f', fence), 'PX', ARGV[2] + ARGV[3])
return {1, fence}
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
