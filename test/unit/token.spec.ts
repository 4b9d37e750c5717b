import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { inspect } from 'node:util';
import { LockLostError } from '../../lib/index.js';
import { freshToken } from '../../lib/utils/token.js';

describe('owner tokens', () => {
  it('are 128 bits, hex, and never repeat across pool refills', () => {
    const tokens = Array.from({ length: 2_000 }, freshToken); // several refills of 256
    for (const token of tokens) assert.match(token, /^[0-9a-f]{32}$/);
    assert.equal(new Set(tokens).size, tokens.length);
  });
});

describe('LockLostError', () => {
  it('carries its token, but never shows it: not enumerable, out of inspect, console and JSON', () => {
    const token = freshToken();
    const error = new LockLostError('order:1', token, 'not-held');
    assert.equal(error.token, token);
    assert.equal(Object.keys(error).includes('token'), false);
    assert.equal(inspect(error).includes(token), false);
    assert.equal(JSON.stringify(error).includes(token), false);
    assert.equal(error.message.includes(token), false);
  });
});
