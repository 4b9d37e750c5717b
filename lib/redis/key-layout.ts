/**
 * Where a lock's data lives in Redis. For key `K` with prefix `P`: the lock is `P{K}` (value: the
 * owner token; a sorted set of holders for a semaphore or read locks), its fence counter
 * `P{K}:fence`, and releases are announced on channel `P{K}:released`. The hash tag keeps them
 * all in one cluster slot; see `lockKey()` for keys that contain `}`.
 */
export class KeyLayout {
  constructor(private readonly prefix: string) {}

  /**
   * `P{K}`. A `}` inside `K` would end the hash tag early (and one at its start would empty it,
   * hashing the whole name, so the lock and its fence counter could land in different slots), so
   * `}` is written `%7D` and, to keep the mapping one-to-one, `%` is written `%25`.
   */
  lockKey(key: string): string {
    return `${this.prefix}{${ESCAPED.test(key) ? key.replace(ESCAPED_ALL, escapeChar) : key}}`;
  }

  /**
   * A semaphore's or read lock's keys: its holders, the fence counter, and the fences its callers'
   * own tokens hold (see `SHARED_FENCE`), in the key's slot.
   */
  shapeKeys(lockKey: string): [string, string, string] {
    return [lockKey, `${lockKey}:fence`, `${lockKey}:fences`];
  }

  /** A fair lock's queue and its waiters' stay (see `ACQUIRE_FAIR_SCRIPT`), in the key's slot. */
  queueKeys(lockKey: string): [string, string] {
    return [`${lockKey}:queue`, `${lockKey}:queue:stay`];
  }

  /** The channel on which releases of `key` are announced. */
  releaseChannel(key: string): string {
    return `${this.lockKey(key)}:released`;
  }

  /** The channel on which a fair waiter (`token`) of `key` hears that it is its turn. */
  turnChannel(key: string, token: string): string {
    return `${this.lockKey(key)}:fair:${token}`;
  }
}

const ESCAPED = /[%}]/;
const ESCAPED_ALL = /[%}]/g;
const escapeChar = (char: string): string => (char === '%' ? '%25' : '%7D');
