/**
 * The Lua scripts behind every lock operation. Each runs as one atomic step inside Redis, so no
 * other client can observe or act between its check of the owner token and its write. Keys are
 * always passed in KEYS (never spliced into the text), so the scripts work on every cluster node:
 * the lock key and its fence key share a hash tag, hence a slot.
 */

/**
 * The fence of a new holder, as a Lua snippet shared by the acquire and handoff scripts (KEYS[2]
 * fence key; `ttl` and `retention` are Lua expressions): the counter's last value + 1 while the
 * counter key lives (it outlives the lock by the fence retention), so strictly increasing; when
 * the counter is gone it restarts from the server's TIME in microseconds, which is still greater
 * than every earlier fence unless the server clock went back by more than the time since the
 * counter was last written.
 */
const NEXT_FENCE = (ttl: string, retention: string): string => `
local fence = redis.call('INCR', KEYS[2])
if fence == 1 then
  local now = redis.call('TIME')
  fence = tonumber(now[1]) * 1000000 + tonumber(now[2])
  redis.call('SET', KEYS[2], string.format('%.0f', fence), 'PX', ${ttl} + ${retention})
else
  redis.call('PEXPIRE', KEYS[2], ${ttl} + ${retention})
end
return fence
`;

/**
 * KEYS[1] lock key, KEYS[2] fence key; ARGV[1] token, ARGV[2] ttl ms, ARGV[3] fence retention ms.
 * Returns one integer (one reply to decode, not an array): the fence (> 0) when the caller holds
 * the lock afterwards; when someone else does, -2 - the holder's remaining TTL in ms (or -1 when
 * that lock has no TTL). A free key costs SET NX + INCR + PEXPIRE (TIME and SET instead of PEXPIRE
 * when the counter is new).
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
${NEXT_FENCE('ARGV[2]', 'ARGV[3]')}`;

/**
 * KEYS[1] lock key, KEYS[2] fence key; ARGV[1] releasing token, ARGV[2] heir's token, ARGV[3]
 * heir's ttl ms, ARGV[4] fence retention ms.
 * Releases the lock straight to a waiter: if the releasing token still holds it, the heir's token
 * takes its place with the heir's TTL and a new fence, in one step, so the lock is never free in
 * between (nobody is woken: nobody else could take it). Returns the heir's fence, or 0 if the
 * releasing token no longer held the lock (then nothing changed).
 */
export const HANDOFF_SCRIPT = `
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
${NEXT_FENCE('ARGV[3]', 'ARGV[4]')}`;

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
 * Redlock mode, after a majority of nodes granted the lock with different fences (KEYS[1] lock
 * key, KEYS[2] fence key; ARGV[1] token, ARGV[2] the highest of those fences, ARGV[3] ttl ms,
 * ARGV[4] fence retention ms): where the token holds the lock, raises the node's counter to that
 * fence, so that every later holder, whose majority shares a node with this one's, gets a higher
 * fence. Returns 1 where the token holds the lock, 0 elsewhere (nothing changed).
 */
export const RAISE_FENCE_SCRIPT = `
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
local counter = tonumber(redis.call('GET', KEYS[2]) or '0')
if counter < tonumber(ARGV[2]) then
  redis.call('SET', KEYS[2], ARGV[2], 'PX', ARGV[3] + ARGV[4])
end
return 1
`;

/**
 * Deletes the lock only if the token still holds it, and announces the release to waiters in the
 * same step (message ARGV[3]: empty, or in Redlock mode an id of the release, which is announced
 * on every node). Returns 0 if the lock was no longer this token's, otherwise 1 + the number of
 * subscriber connections the announcement reached (on Cluster: on this node).
 */
const release = (deleted: string, publish: 'PUBLISH' | 'SPUBLISH'): string => `
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('DEL', ${deleted})
return 1 + redis.call('${publish}', ARGV[2], ARGV[3])
`;

/**
 * KEYS[1] lock key, KEYS[2] fence key (kept); ARGV[1] token, ARGV[2] release channel, ARGV[3]
 * message. See `release`.
 */
export const RELEASE_SCRIPT = release('KEYS[1]', 'PUBLISH');

/**
 * KEYS[1] lock key, KEYS[2] fence key; ARGV[1] token, ARGV[2] release channel, ARGV[3] message.
 * The release with `fenceRetention: 0`: the fence counter goes with the lock, nothing of the key
 * stays in Redis.
 */
export const RELEASE_FORGETTING_SCRIPT = release('KEYS[1], KEYS[2]', 'PUBLISH');

/**
 * The releases on a Cluster of Redis >= 7: announced with `SPUBLISH` on the channel, which shares
 * the lock's hash slot, so only the node that owns the slot (and its replicas) carries the message
 * instead of every node in the cluster.
 */
export const RELEASE_SHARDED_SCRIPT = release('KEYS[1]', 'SPUBLISH');
export const RELEASE_FORGETTING_SHARDED_SCRIPT = release('KEYS[1], KEYS[2]', 'SPUBLISH');
