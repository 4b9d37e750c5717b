import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { freshToken } from '../../lib/utils/token.js';

describe('owner tokens', () => {
  it('are 128 bits, hex, and never repeat across pool refills', () => {
    const tokens = Array.from({ length: 2_000 }, freshToken); // several refills of 256
    for (const token of tokens) assert.match(token, /^[0-9a-f]{32}$/);
    assert.equal(new Set(tokens).size, tokens.length);
  });
});
