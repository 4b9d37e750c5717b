/**
 * The Lua scripts behind every lock operation. Each runs as one atomic step inside Redis, so no
 * other client can observe or act between its check of the owner token and its write. Keys are
 * always passed in KEYS (never spliced into the text), so the scripts work on every cluster node:
 * a script's keys share a hash slot (see `KeyLayout`).
 *
 * A plain lock is a string (the owner token); a counting semaphore (`limit` > 1) keeps its holders
 * in a sorted set under the same key name, each token scored with its expiry on the Redis server's
 * clock. The plain scripts read the token with `pcall`: a key that is a semaphore's set (or anything
 * but a string) is someone else's lock, never an error.
 */

/**
 * How many fences one grant from Redis takes to a generated token (see `FENCE_OF`): its own and
 * the next 15, which it may pass on to waiters of its own process without a round trip (see
 * `PASS_ON_SCRIPT`).
 */
export const FENCE_STRIDE = 16;

/**
 * Lengthens the counter's TTL to `ttl` ms (a Lua expression) if it would end sooner: it is shared,
 * so a holder with a short TTL must not cut short what a longer one set. `GT` does it in one
 * command, where a `PTTL` and a `PEXPIRE` measured ~2 µs more of Redis time per acquire. `GT`
 * leaves a key without a TTL as it is: the scripts that create the counter give it its first TTL
 * themselves (see FENCE_OF, RAISE_FENCE_SCRIPT), so only a counter written by hand without one
 * keeps none (it outlives every lock, which is all a fence needs).
 */
export const KEEP_COUNTER = (counter: string, ttl: string): string => `
redis.call('PEXPIRE', ${counter}, ${ttl}, 'GT')`;

/**
 * The fence of a new holder, as a Lua snippet shared by the acquire and handoff scripts (`counter`
 * the fence counter, shared by every key of the slot, see `KeyLayout.counterKey`; `counterTtl` a
 * Lua expression): the server's clock in microseconds (`TIME`), or the counter's last value + 1
 * where that is higher, so strictly greater than every fence the counter gave, across all its
 * keys, hence per key. The counter outlives every lock it fenced by the fence retention (its TTL
 * only ever grows, see KEEP_COUNTER). Where it is gone (expired, or behind: a promoted replica that
 * missed the last writes), the clock still puts the fence above every earlier one unless the
 * server's clock is behind the clock that issued them by more than the time since (a clock stepped
 * back, a replica's clock lagging the old master's by more than the failover took). It runs ahead
 * of the clock only while its keys are granted more than a fence per µs (1,000,000 / `stride` a
 * second), and only by the excess. With `stride` > 1 the fence is the first of a block of
 * `stride`: the rest is reserved for this holder's in-process heirs.
 *
 * One `SET … GET` reads the counter and writes the clock's block in one command; only where the
 * counter was ahead (rare, see above) does a second `SET` put it right, in the same atomic step; a
 * counter that was not there gets its first TTL (see KEEP_COUNTER).
 *
 * The counter's TTL (the lock's TTL + the fence retention) comes summed by the client, in every
 * script: an addition in Lua turns two arguments into numbers and the sum back into a string for
 * the command, which measured ~2 µs of Redis time per acquire (a quarter of the acquire script's).
 */
export const FENCE_OF = (
  counter: string,
  counterTtl: string,
  stride = 1,
  floor?: string,
): string => {
  const block = (fence: string): string =>
    `string.format('%.0f', ${fence}${stride > 1 ? ` + ${stride - 1}` : ''})`;
  return `
local clock = redis.call('TIME')
local fence = tonumber(clock[1]) * 1000000 + tonumber(clock[2])${
    floor
      ? `
if fence < tonumber(${floor}) then fence = tonumber(${floor}) end`
      : ''
  }
local last = redis.call('SET', ${counter}, ${block('fence')}, 'GET', 'KEEPTTL')
if last then
  last = tonumber(last)
  if last >= fence then
    fence = last + 1
    redis.call('SET', ${counter}, ${block('fence')}, 'KEEPTTL')
  end${KEEP_COUNTER(counter, counterTtl)}
else
  redis.call('PEXPIRE', ${counter}, ${counterTtl})
end`;
};
export const NEXT_FENCE = (
  counterTtl: string,
  stride = 1,
  after = '',
  tagged = false,
  floor?: string,
): string => `
${FENCE_OF('KEYS[2]', counterTtl, stride, floor)}${after}
return ${tagged ? '{ fence, 0 }' : 'fence'}
`;

/**
 * Several plain locks in one step, all or none (one deployment, not a Cluster: the keys need not
 * share a slot). KEYS: lock key, fence counter, for each key; ARGV[1] a fresh token, ARGV[2] ttl ms,
 * ARGV[3] the fence counter's TTL ms (see FENCE_OF). If every key is free, takes them all and
 * returns their fences in KEYS order; else takes none and returns -2 - the remaining TTL of the
 * first taken key (-1 when unknown), and the caller goes on key by key, waiting as usual.
 */
export const ACQUIRE_ALL_SCRIPT = `
for i = 1, #KEYS, 2 do
  if redis.call('EXISTS', KEYS[i]) == 1 then
    local pttl = redis.call('PTTL', KEYS[i])
    if pttl < 0 then return -1 end
    return -2 - pttl
  end
end
local fences = {}
for i = 1, #KEYS, 2 do
  redis.call('SET', KEYS[i], ARGV[1], 'PX', ARGV[2])
  ${FENCE_OF('KEYS[i + 1]', 'ARGV[3]')}
  fences[#fences + 1] = fence
end
return fences
`;

/**
 * Read locks keep their readers in a hash under the lock's key: field = reader token, value = the
 * reader's expiry on the Redis server's clock (ms). The empty field is the mark of a waiting
 * writer: while it lives, no new reader joins, so a stream of readers cannot starve writers.
 * This snippet (KEYS[1] the hash, ARGV[1] a token) drops lapsed fields and leaves `now`,
 * `readers` (live ones), `last` (latest expiry of any field), `writer` (the mark's expiry, or
 * nil) and `mine` (ARGV[1] is a live reader).
 */
export const SCAN_READERS = `
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
local readers, last, writer, mine = 0, 0, nil, false
local fields = redis.call('HGETALL', KEYS[1])
for i = 1, #fields, 2 do
  local expiry = tonumber(fields[i + 1])
  if expiry <= now then
    redis.call('HDEL', KEYS[1], fields[i])
  else
    if expiry > last then last = expiry end
    if fields[i] == '' then
      writer = expiry
    else
      readers = readers + 1
      if fields[i] == ARGV[1] then mine = true end
    end
  end
end
`;

/**
 * A writer that will wait marks the readers' hash (`stay`, a Lua expression: ms, or nil when it
 * will not wait): no new reader joins until the mark lapses, `stay` after this attempt. The writer
 * renews it with every attempt, and its attempts come closer together than that (its pause, at
 * most `retryInterval` + jitter, and the reply's trip), so readers cannot starve it however long
 * its own TTL or theirs; a writer that died holds new readers off for at most `stay`.
 */
export const MARK_WRITER = (stay: string): string => `
if ${stay} then
  local mark = now + tonumber(${stay})
  if (writer or 0) < mark then redis.call('HSET', KEYS[1], '', mark) end
  if mark > last then last = mark end
  redis.call('PEXPIRE', KEYS[1], last - now)
end`;

/**
 * KEYS[1] the lock key, KEYS[2] its queue of waiting processes (see JOIN_TURNS); ARGV[1]
 * (optional) the id of a process none of whose callers waits for it any more. A writer that gave
 * up takes back the mark on read locks, if there is one, and its process leaves the queue.
 */
export const DROP_MARK_SCRIPT = `
if redis.call('TYPE', KEYS[1]).ok == 'hash' then redis.call('HDEL', KEYS[1], '') end
if ARGV[1] then redis.call('ZREM', KEYS[2], ARGV[1]) end
return 0
`;

/**
 * The plain lock's (a writer's) way past a read lock, inside ACQUIRE_SCRIPT (ARGV[2] its ttl,
 * ARGV[4] when it will wait, its mark's stay in ms, see MARK_WRITER): while readers hold the key,
 * it reports busy (marked, if it will wait); once none is left, it replaces the hash with its lock
 * and goes on to take its fence.
 */
const WRITER_AFTER_READERS = `
${SCAN_READERS}
if readers > 0 then
  ${MARK_WRITER('ARGV[4]')}
  return -2 - (last - now)
end
redis.call('DEL', KEYS[1])
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])`;

/**
 * The caller's own token already holds the lock: renews it (never shorter: a handle of this lock
 * taken earlier with a longer TTL keeps its lease) and returns its fence, unchanged, kept
 * in `record` (a Lua expression: its key, see `KeyLayout.ownFenceKey`; if it is gone, the script
 * goes on to a new fence). KEYS[1] lock key, KEYS[2] fence counter; ARGV[2] ttl ms, ARGV[3] fence
 * counter TTL ms.
 */
export const RENEW_OWN = (record: string, tagged = false): string => `
redis.call('PEXPIRE', KEYS[1], ARGV[2], 'GT')
local held = redis.call('GET', ${record})
if held then
  redis.call('PEXPIRE', ${record}, ARGV[2], 'GT')${KEEP_COUNTER('KEYS[2]', 'ARGV[3]')}
  ${tagged ? TAGGED_RECORD : 'return tonumber(held)'}
end`;

/**
 * Redlock mode: a node's record answers `{ fence, 2 }` when it is the holder's fence (written by
 * `RAISE_FENCE_SCRIPT` or `RESTORE_COPY_SCRIPT`), `{ fence, 1 }` when it is only the fence this
 * node counted at its grant (`~` and the number, see `RECORD_OWN`), which the holder's may differ
 * from until the second round reaches this node.
 */
const TAGGED_RECORD = `local settled = tonumber(held)
  if settled then return { settled, 2 } end
  return { tonumber(string.sub(held, 2)), 1 }`;

/**
 * Writes an own token's new fence down in `record` (see RENEW_OWN), for as long as its lock;
 * `provisional` in Redlock mode, where the holder's fence is decided over a majority (see
 * TAGGED_RECORD).
 */
export const RECORD_OWN = (record: string, provisional = false): string => `
redis.call('SET', ${record}, '${provisional ? '~' : ''}' .. string.format('%.0f', fence), 'PX', ARGV[2])`;

/**
 * A generated token already holds the lock: only when ioredis resent an attempt whose reply was
 * lost with its connection. The caller never saw the first grant's fences, and the counter stands
 * at the end of that grant's block, not at its fence: renews the lock and goes on to a new block.
 */
const RENEW_RESENT = `
redis.call('PEXPIRE', KEYS[1], ARGV[2])`;

/**
 * Puts `id` in the queue `turns` at the back (`mode` 'NX': unless it is in it already), for at
 * least `stay` ms: the queue's TTL only grows, so a process whose stay is shorter (another
 * `retryInterval`) never cuts short the places of others.
 */
const QUEUE_AT = (mode: 'NX' | '', turns: string, id: string, stay: string): string => `
  local clock = redis.call('TIME')
  redis.call('ZADD', ${turns}, ${mode ? `'${mode}', ` : ''}tonumber(clock[1]) * 1000000 + tonumber(clock[2]), ${id})
  if redis.call('PTTL', ${turns}) < tonumber(${stay}) then redis.call('PEXPIRE', ${turns}, ${stay}) end`;

/**
 * The queue of processes waiting for a plain lock (`turns`, a sorted set: process id → when it
 * joined, on the server's clock in µs; see `KeyLayout.turnsKey`): a process whose waiter will wait
 * joins it when its attempt finds the key held (`NX`: a process keeps its place), for `stay` ms
 * after its last attempt (its first waiter attempts at least every `retryInterval`); a release
 * names the process that has waited longest (see `NAME_NEXT`), and only that one tries. `id` and
 * `stay` are Lua expressions; nothing happens when `id` is nil.
 */
const JOIN_TURNS = (turns: string, id: string, stay: string): string => `
if ${id} then
  ${QUEUE_AT('NX', turns, id, stay)}
end`;

/**
 * KEYS[1] lock key, KEYS[2] fence counter, KEYS[3] the own fence's record for the caller's own
 * token, or, for a generated token, the key's queue of waiting processes (see JOIN_TURNS);
 * ARGV[1] token, ARGV[2] ttl ms, ARGV[3] fence counter TTL ms, ARGV[4] (optional) when the caller
 * will wait, how long its mark holds new readers off (see MARK_WRITER) and its process's place in
 * the queue lasts, ARGV[5] (optional, with a generated token that will wait) the id of its
 * process: it joins the queue if the key is held (it leaves it at its release, see NAME_NEXT, not
 * here: a free key costs no more than without the queue). Returns one
 * integer (one reply to decode): the fence (> 0) when the caller holds the lock afterwards; when
 * someone else does, -2 - the holder's remaining TTL in ms (or -1 when that lock has no TTL). A
 * free key costs SET NX + TIME + SET GET + PEXPIRE GT of the counter (see FENCE_OF). A key held
 * by readers: see WRITER_AFTER_READERS. `named` (Redlock mode): a refusal answers
 * `{ -2 - pttl, holder }` (or `{ -1, holder }`), the token that holds the key on this node, so that
 * the caller can tell a split vote from a holder's majority (see `RedlockBackend.splitVote`).
 */
const ACQUIRE = (
  renewOwn: string,
  stride: number,
  record = '',
  turns = false,
  tagged = false,
  floor?: string,
  named = false,
): string => `
if not redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  local holder = redis.pcall('GET', KEYS[1])
  if holder == ARGV[1] then
    ${renewOwn}
  elseif redis.call('TYPE', KEYS[1]).ok ~= 'hash' then${turns ? JOIN_TURNS('KEYS[3]', 'ARGV[5]', 'ARGV[4]') : ''}
    local pttl = redis.call('PTTL', KEYS[1])${
      named
        ? `
    if type(holder) ~= 'string' then holder = '' end
    if pttl < 0 then return { -1, holder } end
    return { -2 - pttl, holder }`
        : `
    if pttl < 0 then return -1 end
    return -2 - pttl`
    }
  else
    ${WRITER_AFTER_READERS}
  end
end
${NEXT_FENCE('ARGV[3]', stride, record, tagged, floor)}`;

/**
 * The plain lock for a token this library generated: takes a block of `FENCE_STRIDE` fences and
 * returns the first (see `ACQUIRE`).
 */
export const ACQUIRE_SCRIPT = ACQUIRE(RENEW_RESENT, FENCE_STRIDE, '', true);

/** The plain lock for a generated token where no fences are reserved (see `FENCE_STRIDE`). */
export const ACQUIRE_UNRESERVED_SCRIPT = ACQUIRE(RENEW_RESENT, 1, '', true);

/**
 * Redlock mode, a generated token on one node: as `ACQUIRE_UNRESERVED_SCRIPT` (no queue of
 * waiting processes), with ARGV[5] a floor for the fence, in µs: the fence is the highest of the
 * server's clock, the counter's last value + 1 and the floor. The nodes of a majority that all
 * answer the floor agree on the fence, and the second round that would bring their counters to it
 * is not needed (see `RedlockBackend.fenceFloor`). A floor only ever raises a fence.
 */
export const ACQUIRE_REDLOCK_SCRIPT = ACQUIRE(RENEW_RESENT, 1, '', false, false, 'ARGV[5]', true);

/**
 * The plain lock for the caller's own token (`AcquireOptions.token`): one fence per grant, so
 * re-acquiring with the token that holds the lock returns the same fence (see `ACQUIRE`).
 */
export const ACQUIRE_OWN_TOKEN_SCRIPT = ACQUIRE(RENEW_OWN('KEYS[3]'), 1, RECORD_OWN('KEYS[3]'));

/**
 * Redlock mode, the caller's own token on one node: as `ACQUIRE_OWN_TOKEN_SCRIPT`, but a grant
 * answers `{ fence, renewed }`, 1 when the token held the lock here with its fence recorded (the
 * fence it was granted before), 0 for a new fence: a re-acquisition keeps the recorded fence, and
 * the nodes that granted anew are brought to it (see `RAISE_FENCE_SCRIPT`).
 */
export const ACQUIRE_OWN_TOKEN_REDLOCK_SCRIPT = ACQUIRE(
  RENEW_OWN('KEYS[3]', true),
  1,
  RECORD_OWN('KEYS[3]', true),
  false,
  true,
  undefined,
  true,
);

/**
 * KEYS[1] lock key, KEYS[2] fence counter; ARGV[1] releasing token, ARGV[2] heir's token, ARGV[3]
 * heir's ttl ms, ARGV[4] fence counter TTL ms (the heir's ttl + the retention).
 * Releases the lock straight to a waiter: if the releasing token still holds it, the heir's token
 * takes its place with the heir's TTL and a new block of `stride` fences, in one step, so the lock
 * is never free in between (nobody is woken: nobody else could take it). Returns the heir's fence
 * (the block's first), or 0 if the releasing token no longer held the lock (then nothing changed).
 * If the heir's token holds it already, ioredis resent the script after a lost reply (a client of
 * the app's own with `autoResendUnfulfilledCommands`): the heir never saw the first block, so it
 * gets a new one, as a resent grant does (see RENEW_RESENT), instead of a 0 that would leave its
 * lock to run out its TTL with nobody holding it.
 */
const HANDOFF = (stride: number): string => `
local held = redis.pcall('GET', KEYS[1])
if held ~= ARGV[1] and held ~= ARGV[2] then return 0 end
redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
${NEXT_FENCE('ARGV[4]', stride)}`;

/** The handoff that reserves a block of fences for the heir's own heirs (see `HANDOFF`). */
export const HANDOFF_SCRIPT = HANDOFF(FENCE_STRIDE);

/** The handoff that takes one fence: with `fenceRetention: 0` (see `HANDOFF`). */
export const HANDOFF_UNRESERVED_SCRIPT = HANDOFF(1);

/**
 * KEYS[1] lock key, KEYS[2] fence counter; ARGV[1] releasing token, ARGV[2] heir's token, ARGV[3]
 * heir's ttl ms, ARGV[4] fence counter TTL ms.
 * Writes down a handoff that already happened in the process: the heir started at once, with the
 * next fence of its predecessor's block (reserved in Redis when the block was taken, so no counter
 * changes), on its predecessor's lease. If the releasing token still holds the lock, the heir's
 * token takes its place with the heir's TTL. Returns 1 then, or if the heir's token already holds
 * it (ioredis resent the script after a lost reply); 0 if neither holds it (nothing changed: the
 * heir has lost the lock).
 */
export const PASS_ON_SCRIPT = `
local held = redis.pcall('GET', KEYS[1])
if held ~= ARGV[1] and held ~= ARGV[2] then return 0 end
redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])${KEEP_COUNTER('KEYS[2]', 'ARGV[4]')}
return 1
`;

/**
 * KEYS[1] lock key, KEYS[2] fence counter, KEYS[3] an own token's fence record (see RENEW_OWN;
 * none for a generated token); ARGV[1] token, ARGV[2] ttl ms, ARGV[3] fence counter TTL ms.
 * Returns 1 if the token still held the lock and its TTL was reset, 0 otherwise. Never creates a
 * lock that is gone.
 */
export const EXTEND_SCRIPT = `
if redis.pcall('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
redis.call('PEXPIRE', KEYS[3], ARGV[2])${KEEP_COUNTER('KEYS[2]', 'ARGV[3]')}
return 1
`;

/**
 * Redlock mode, after a majority of nodes granted the lock with different fences (KEYS[1] lock
 * key, KEYS[2] fence counter, KEYS[3] the own token's fence record; ARGV[1] token, ARGV[2] the
 * holder's fence, ARGV[3] the fence counter's TTL ms, ARGV[4] '1' for a caller's own token): where
 * the token holds the lock, raises the node's counter to that fence, so that every later holder,
 * whose majority shares a node with this one's, gets a higher fence, and for an own token writes
 * the fence down as its record (for as long as the lock), so that a re-acquisition on any of
 * these nodes answers it: unless a higher one is recorded there (two first acquisitions with one
 * token at once, each deciding on its own majority, may get two fences; the nodes converge on the
 * higher). Returns 1 where the token holds the lock, 0 elsewhere (nothing changed).
 */
export const RAISE_FENCE_SCRIPT = `
if redis.pcall('GET', KEYS[1]) ~= ARGV[1] then return 0 end
if ARGV[4] == '1' and (tonumber(redis.call('GET', KEYS[3])) or 0) < tonumber(ARGV[2]) then
  redis.call('SET', KEYS[3], ARGV[2], 'PX', math.max(redis.call('PTTL', KEYS[1]), 1))
end
local counter = redis.call('GET', KEYS[2])
if not counter then
  redis.call('SET', KEYS[2], ARGV[2], 'PX', ARGV[3])
  return 1
end
if tonumber(counter) < tonumber(ARGV[2]) then redis.call('SET', KEYS[2], ARGV[2], 'KEEPTTL') end${KEEP_COUNTER('KEYS[2]', 'ARGV[3]')}
return 1
`;

/**
 * Redlock mode: writes a holder's copy back on a node that forgot it (KEYS[1] lock key, KEYS[2]
 * the own token's fence record; ARGV[1] token, ARGV[2] ms, ARGV[3] the holder's fence): only where
 * the key is free, with the fence recorded, so that a re-acquisition with an own token answers it
 * there too. Sent with EVAL, never EVALSHA (see `RedisLockBackend.restoreCopy`).
 */
export const RESTORE_COPY_SCRIPT = `
if not redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return 0 end
redis.call('SET', KEYS[2], ARGV[3], 'PX', ARGV[2])
return 1
`;

/**
 * A release names the next process to try (KEYS[3] the key's queue of waiting processes, see
 * JOIN_TURNS; ARGV[4] the releasing process's id, ARGV[5] set when that process still waits: its
 * place's stay in ms): the one that has waited longest, other than the releaser, leaves the queue
 * and is named in the message (`>` and its id), and only its waiters try (see
 * `ReleaseNotifier`); a releaser that still waits goes to the back of the queue (its turn is
 * over), else it leaves it. With nobody queued, the message stays as it was (everyone tries).
 */
const NAME_NEXT = `
local message = ARGV[3]
if ARGV[4] and message == '' then
  local queued = redis.call('ZRANGE', KEYS[3], 0, 1)
  if queued[1] then
    local next = queued[1]
    if next == ARGV[4] then next = queued[2] end
    if next then
      redis.call('ZREM', KEYS[3], next)
      message = '>' .. next
    end
    if not ARGV[5] then redis.call('ZREM', KEYS[3], ARGV[4]) end
  end
  if ARGV[5] then${QUEUE_AT('', 'KEYS[3]', 'ARGV[4]', 'ARGV[5]')}
  end
end`;

/**
 * The end of a release script: announces it (`publish`: PUBLISH, or SPUBLISH on a Cluster) on
 * `channel` and returns 1 + the subscribers reached, or `ANNOUNCE_REFUSED` (-1) if Redis refused
 * to publish (a user whose ACL allows the keys but not the channel): the release is done all the
 * same (a script's writes stay when a later command fails, so an error would report a deleted
 * lock as not released), and waiters elsewhere find the key free at their next timed attempt.
 */
export const ANNOUNCE = (
  publish: 'PUBLISH' | 'SPUBLISH',
  channel: string,
  message: string,
): string => `
local heard = redis.pcall('${publish}', ${channel}, ${message})
if type(heard) ~= 'number' then return -1 end
return 1 + heard`;

/** What a release script returns when Redis refused its announcement (see `ANNOUNCE`). */
export const ANNOUNCE_REFUSED = -1;

/**
 * KEYS[1] lock key, KEYS[2] an own token's fence record (see RENEW_OWN; none for a generated
 * token), KEYS[3] the key's queue of waiting processes; ARGV[1] token, ARGV[2] release channel,
 * ARGV[3] message (empty, or in Redlock mode an id of the release, which is announced on every
 * node), ARGV[4] and ARGV[5] (optional): see NAME_NEXT. Deletes the lock (and the record) only if
 * the token still holds it, and announces the release to waiters in the same step: nothing of the
 * key stays in Redis. Returns 0 if the lock was no longer this token's, otherwise 1 + the number
 * of subscriber connections the announcement reached (on Cluster: on this node).
 */
const release = (publish: 'PUBLISH' | 'SPUBLISH'): string => `
if redis.pcall('GET', KEYS[1]) ~= ARGV[1] then
  -- No longer ours (it ran out): the process still leaves the queue if none of its callers waits.
  if ARGV[4] and not ARGV[5] then redis.call('ZREM', KEYS[3], ARGV[4]) end
  return 0
end
redis.call('DEL', KEYS[1], KEYS[2])${NAME_NEXT}${ANNOUNCE(publish, 'ARGV[2]', 'message')}
`;

export const RELEASE_SCRIPT = release('PUBLISH');

/**
 * Redlock mode: the undo of a failed attempt's copy that frees nothing a waiter could use (a
 * majority of nodes refused the attempt: another holder has the key there), so it announces
 * nothing. KEYS[1] lock key, KEYS[2] the own token's fence record; ARGV[1] token. Returns 1 if the
 * copy was this token's and is deleted, else 0. (Announced, each such undo woke the waiters, whose
 * attempts failed and were undone in turn: thousands of attempts a second for as long as the
 * holder kept its majority without one node's copy.)
 */
export const UNDO_QUIETLY_SCRIPT = `
if redis.pcall('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1], KEYS[2])
return 1
`;

/**
 * Redlock mode: the undo of a failed attempt's copy with a caller's own token (KEYS[1] lock key,
 * KEYS[2] the token's fence record; ARGV[1] token, ARGV[2] the provisional record this attempt's
 * grant wrote here, `~` and its fence, see RECORD_OWN; ARGV[3] and ARGV[4], optional: release
 * channel and message, to announce it). Only while that record is still there: another holder of
 * the same token that re-took the copy since settled the record before it counted the copy (its
 * second round, see RAISE_FENCE_SCRIPT), so a settled record means the copy is that holder's
 * lock now and stays; an undo that lands first leaves that holder's second round without this
 * node. Returns 1 if the copy is deleted, else 0.
 */
export const UNDO_OWN_SCRIPT = `
if redis.pcall('GET', KEYS[1]) ~= ARGV[1] or redis.call('GET', KEYS[2]) ~= ARGV[2] then return 0 end
redis.call('DEL', KEYS[1], KEYS[2])
if ARGV[3] then redis.pcall('PUBLISH', ARGV[3], ARGV[4]) end
return 1
`;

/**
 * The release on a Cluster of Redis >= 7: announced with `SPUBLISH` on the channel, which shares
 * the lock's hash slot, so only the node that owns the slot (and its replicas) carries the message
 * instead of every node in the cluster.
 */
export const RELEASE_SHARDED_SCRIPT = release('SPUBLISH');
