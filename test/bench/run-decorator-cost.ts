/**
 * `npm run bench:decorator`: what a locked call costs in-process, without HTTP, one layer at a
 * time: the hand-written minimum lock (`SET NX PX`, compare-and-delete) around a method, the same
 * method in `LockService.using()`, under `@WithLock`, and under `@WithLock` on a method whose
 * caller holds the key already (re-entry: the sample's purchase route locks this way). One Nest
 * application context, one private redis-server, sequential calls on 1,000 distinct keys, the
 * kinds interleaved over the rounds (order reversed every other round, the first two rounds
 * discarded as warm-up); per kind the medians of the wall time and of the process's CPU per call.
 * Run it under `taskset -c 0` to put the client and Redis on one CPU, where the wall time is the
 * two's CPU together.
 *
 * Options: --calls N (5,000 per kind and round), --rounds N (12).
 */
import 'reflect-metadata';
import { Inject, Injectable, Module } from '@nestjs/common';
import { NestFactory } from '@nestjs/core';
import { Redis } from 'ioredis';
import { parseArgs } from 'node:util';
import { LockService, RedisLockModule, WithLock } from '../../lib/index.js';
import { startRedis } from '../support/redis-server.js';
import { CONTENDERS } from './contenders.js';

const { values } = parseArgs({
  options: {
    calls: { type: 'string', default: '5000' },
    rounds: { type: 'string', default: '12' },
  },
});
const calls = Number(values.calls);
const rounds = Number(values.rounds);

const server = await startRedis();
const client = new Redis(server.port, '127.0.0.1');
const minimum = await CONTENDERS[0].create({ client, nodes: [client] });

@Injectable()
class Calls {
  constructor(@Inject(LockService) private readonly locks: LockService) {}

  /** The work under every lock: nothing, so that what is measured is the lock. */
  work(): Promise<number> {
    return Promise.resolve(1);
  }

  async minimum(sku: string): Promise<number> {
    const held = await minimum.acquire(`sku:${sku}`, 10_000, 30_000);
    try {
      return await this.work();
    } finally {
      await held.release();
    }
  }

  using(sku: string): Promise<number> {
    return this.locks.using(`sku:${sku}`, () => this.work());
  }

  @WithLock({ key: 'sku:{0}' })
  decorated(_sku: string): Promise<number> {
    return this.work();
  }

  @WithLock({ key: 'sku:{0}' })
  reentered(sku: string): Promise<number> {
    return this.decorated(sku);
  }
}

@Module({
  imports: [RedisLockModule.forRoot({ client, keyPrefix: 'cost:' })],
  providers: [Calls],
})
class DecoratorCostModule {}

const KINDS = [
  ['minimum', 'hand-written minimum lock around the method'],
  ['using', '`LockService.using()`'],
  ['decorated', '`@WithLock`'],
  ['reentered', '`@WithLock` whose method calls another on the same key (re-entry)'],
] as const;

const app = await NestFactory.createApplicationContext(DecoratorCostModule, { logger: false });
try {
  const target = app.get(Calls);
  const wall = new Map<string, number[]>(KINDS.map(([kind]) => [kind, []]));
  const cpu = new Map<string, number[]>(KINDS.map(([kind]) => [kind, []]));
  for (let round = 0; round < rounds; round++) {
    const order = round % 2 ? [...KINDS].reverse() : KINDS;
    for (const [kind] of order) {
      const started = performance.now();
      const cpuBefore = process.cpuUsage();
      for (let i = 0; i < calls; i++) await target[kind](`d${i % 1_000}`);
      const { user, system } = process.cpuUsage(cpuBefore);
      if (round < 2) continue; // warm-up
      wall.get(kind)!.push(((performance.now() - started) * 1_000) / calls);
      cpu.get(kind)!.push((user + system) / calls);
    }
    console.log(`round ${round + 1} of ${rounds} done`);
  }
  const median = (xs: number[]): number => [...xs].sort((a, b) => a - b)[xs.length >> 1];
  const base = median(wall.get('minimum')!);
  console.log(
    `\n${calls.toLocaleString('en')} sequential calls per kind and round, ${rounds - 2} rounds measured, medians:\n`,
  );
  console.log('| call | wall µs per call | added to the minimum’s µs | process CPU µs per call |');
  console.log('| --- | --- | --- | --- |');
  for (const [kind, name] of KINDS) {
    const own = median(wall.get(kind)!);
    console.log(
      `| ${name} | ${own.toFixed(1)} | ${kind === 'minimum' ? '—' : (own - base).toFixed(1)} | ${median(cpu.get(kind)!).toFixed(1)} |`,
    );
  }
} finally {
  await app.close();
  await minimum.close();
  client.disconnect();
  await server.stop();
}
