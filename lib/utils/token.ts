import { randomBytes } from 'node:crypto';

/** Tokens drawn from one `randomBytes` call: one entropy request per this many locks. */
const TOKENS_PER_DRAW = 256;
const TOKEN_BYTES = 16;

let pool = Buffer.alloc(0);
let offset = 0;

/**
 * A fresh owner token: 128 bits from `crypto.randomBytes`, hex-encoded. The bytes come from a pool
 * refilled every 256 tokens (as Node's own `randomUUID()` does), so a lock costs no system call
 * for entropy; each byte is used once.
 */
export function freshToken(): string {
  if (offset === pool.length) {
    pool = randomBytes(TOKEN_BYTES * TOKENS_PER_DRAW);
    offset = 0;
  }
  const token = pool.toString('hex', offset, offset + TOKEN_BYTES);
  offset += TOKEN_BYTES;
  return token;
}
