/**
 * Where a lock's data lives in Redis. For key `K` with prefix `P`: the lock is `P{K}` (value: the
 * owner token; a sorted set of holders for a semaphore or read locks), and releases are announced
 * on channel `P{K}:released`. Fences come from a counter shared by every key of a cluster hash slot
 * (`counterKey`), so a held lock costs Redis no key of its own beside the lock; a caller's own
 * token keeps the fence it holds in `P{K}:fence` (see `ownFenceKey`). The hash tags keep every key
 * a script touches in one cluster slot; see `lockKey()` for keys that contain `}`.
 */
export class KeyLayout {
  /** Outside a Cluster: one counter for every key (`P{}:counter`). */
  private readonly sharedCounter: string;

  constructor(
    private readonly prefix: string,
    /** On a Cluster the counter is per hash slot, in the lock's slot (see `counterKey`). */
    private readonly cluster = false,
    /**
     * The client's own ioredis `keyPrefix`, which ioredis adds to every key but not to channels:
     * channels get it here, so that they stay in their lock's hash slot (a prefix with a hash tag
     * of its own puts every key in its slot) and under the same ACL pattern as the keys.
     */
    private readonly clientPrefix = '',
  ) {
    this.sharedCounter = `${prefix}{}:counter`;
  }

  /**
   * `P{K}`. A `}` inside `K` would end the hash tag early (and one at its start would empty it,
   * hashing the whole name, so the lock and its fence counter could land in different slots), so
   * `}` is written `%7D` and, to keep the mapping one-to-one, `%` is written `%25`.
   */
  lockKey(key: string): string {
    return `${this.prefix}{${ESCAPED.test(key) ? key.replace(ESCAPED_ALL, escapeChar) : key}}`;
  }

  /**
   * The fence counter of the lock `lockKey` (see `FENCE_OF`): every new holder's fence is taken
   * from it, so fences increase across all the keys that share it, hence per key. Outside a
   * Cluster one counter serves every key; on a Cluster, one per hash slot, `P{T}:counter` with a
   * tag `T` that hashes to the lock's slot (a script's keys must share one). No per-key name ends
   * in `:counter`, so it never meets a lock's own keys.
   */
  counterKey(lockKey: string): string {
    if (!this.cluster) return this.sharedCounter;
    const slot = slotOf(lockKey.slice(this.prefix.length + 1, -1));
    return `${this.prefix}{${slotTags()[slot]}}:counter`;
  }

  /**
   * Where a caller's own token (`AcquireOptions.token`) keeps the fence it holds on a plain or fair
   * lock, so that acquiring again with it returns the same fence: `P{K}:fence`, for as long as the
   * lock. Generated tokens never come back, and never write it.
   */
  ownFenceKey(lockKey: string): string {
    return `${lockKey}:fence`;
  }

  /**
   * A semaphore's or read lock's keys: its holders, the fence counter, and the fences its callers'
   * own tokens hold (see `SHARED_FENCE`), in the key's slot.
   */
  shapeKeys(lockKey: string): [string, string, string] {
    return [lockKey, this.counterKey(lockKey), `${lockKey}:fences`];
  }

  /**
   * The processes waiting for the plain lock `lockKey`, in the order they will get it (see
   * `JOIN_TURNS`): `P{K}:turns`, only while some wait.
   */
  turnsKey(lockKey: string): string {
    return `${lockKey}:turns`;
  }

  /**
   * An election's record and its participants (see `election.scripts.ts`), in the leader lock's
   * slot: `P{K}:leader`, `P{K}:participants`.
   */
  electionKeys(lockKey: string): [string, string] {
    return [`${lockKey}:leader`, `${lockKey}:participants`];
  }

  /** A fair lock's queue and its waiters' stay (see `ACQUIRE_FAIR_SCRIPT`), in the key's slot. */
  queueKeys(lockKey: string): [string, string] {
    return [`${lockKey}:queue`, `${lockKey}:queue:stay`];
  }

  /**
   * The channel on which releases of the lock `lockKey` are announced: `P{K}:released`, after the
   * client's own `keyPrefix` (see the constructor).
   */
  releaseChannel(lockKey: string): string {
    return `${this.clientPrefix}${lockKey}:released`;
  }

  /**
   * What a fair waiter's channel of the lock `lockKey` starts with: its token follows (see
   * `turnChannel`).
   */
  turnChannels(lockKey: string): string {
    return `${this.clientPrefix}${lockKey}:fair:`;
  }

  /** The channel on which a fair waiter (`token`) of the lock `lockKey` hears its turn. */
  turnChannel(lockKey: string, token: string): string {
    return `${this.turnChannels(lockKey)}${token}`;
  }
}

const ESCAPED = /[%}]/;
const ESCAPED_ALL = /[%}]/g;
const escapeChar = (char: string): string => (char === '%' ? '%25' : '%7D');

/** Cluster hash slots (Redis Cluster specification, "Key distribution model"). */
const SLOTS = 16_384;

/** CRC16 (XMODEM) of `bytes`, as Redis Cluster hashes a key's tag. */
function crc16(bytes: Uint8Array): number {
  let crc = 0;
  for (const byte of bytes) {
    crc ^= byte << 8;
    for (let bit = 0; bit < 8; bit++) {
      crc = crc & 0x8000 ? ((crc << 1) ^ 0x1021) & 0xffff : (crc << 1) & 0xffff;
    }
  }
  return crc;
}

const utf8 = new TextEncoder();

/** The slot of a key whose hash tag is `tag` (not empty, no `}`). */
function slotOf(tag: string): number {
  return crc16(utf8.encode(tag)) % SLOTS;
}

let tags: string[] | undefined;
/**
 * For each slot, the shortest base-36 number whose text hashes to it (at most 4 characters),
 * found once per process on first use (~10 ms).
 */
function slotTags(): string[] {
  if (tags) return tags;
  const found: string[] = new Array<string>(SLOTS);
  let left = SLOTS;
  for (let n = 0; left > 0; n++) {
    const tag = n.toString(36);
    const slot = slotOf(tag);
    if (found[slot] === undefined) {
      found[slot] = tag;
      left--;
    }
  }
  return (tags = found);
}
