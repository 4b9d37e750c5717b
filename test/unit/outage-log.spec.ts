import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import type { Logger } from '@nestjs/common';
import { OutageLog } from '../../lib/utils/outage-log.js';

describe('OutageLog: a repeating failure logged once, summarised, and ended', () => {
  it('one warning at the start, one summary per interval, one line at the end; again for the next outage', () => {
    const lines: string[] = [];
    const logger = {
      warn: (message: string) => lines.push(`warn ${message}`),
      log: (message: string) => lines.push(`log ${message}`),
    } as unknown as Logger;
    let now = 0;
    const outage = new OutageLog(logger, 'Campaign for "k"', 60_000, () => now);
    outage.recovered(); // nothing to end
    for (; now < 150_000; now += 1_000)
      outage.failed(new Error('down'), 'trying again every 1000 ms');
    outage.recovered();
    outage.recovered();
    assert.deepEqual(lines, [
      'warn Campaign for "k" failed; trying again every 1000 ms (a summary every 60 s while it fails, and a line when it works again): Error: down',
      'warn Campaign for "k" still fails after 60.0 s (61 attempts): Error: down',
      'warn Campaign for "k" still fails after 120.0 s (121 attempts): Error: down',
      'log Campaign for "k" works again after 150.0 s (150 failed attempts)',
    ]);
    outage.failed('again', 'trying again every 1000 ms');
    assert.match(lines.at(-1) ?? '', /^warn Campaign for "k" failed; .*: again$/);
  });
});
