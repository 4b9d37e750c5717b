/**
 * `npm run bench:waiters`: what callers waiting for locks cost the process they wait in, the
 * figures `maxWaiters` is chosen from. One process, one private redis-server. For N waiters (10,
 * 1,000, 5,000, 20,000) on one held key, and on N distinct held keys, with and without one
 * `AbortSignal` they all share: the heap they add (per waiter, after a GC), the event
 * loop's delay p99 while they wait (a 2 s window, `monitorEventLoopDelay`), the CPU the process
 * spends meanwhile, and how long the first of them waits once the key is released. Each row runs
 * on a fresh `LockService`; medians over the rounds.
 *
 * Options: --rounds N (3), --sizes 10,1000,5000,20000, --max-waiters N (passed as maxWaiters:
 * with the default limits, rows above them measure calls refused at once).
 */
import 'reflect-metadata';
import { Redis } from 'ioredis';
import { monitorEventLoopDelay } from 'node:perf_hooks';
import { parseArgs } from 'node:util';
import { LockService, type Lock } from '../../lib/index.js';
import { startRedis } from '../support/redis-server.js';

const { values } = parseArgs({
  options: {
    rounds: { type: 'string', default: '3' },
    sizes: { type: 'string', default: '10,1000,5000,20000' },
    'max-waiters': { type: 'string', default: '1000000' },
  },
});
const rounds = Number(values.rounds);
const sizes = values.sizes.split(',').map(Number);
const maxWaiters = Number(values['max-waiters']);

const server = await startRedis();
const median = (xs: number[]): number => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];
const sleep = (ms: number): Promise<void> => new Promise((resolve) => setTimeout(resolve, ms));

interface Sample {
  heapPerWaiter: number;
  delayP99: number;
  cpu: number;
  wake: number;
  refused: number;
}

async function measure(n: number, keys: 'one' | 'distinct', shared: boolean): Promise<Sample> {
  const client = new Redis(server.port, '127.0.0.1');
  const holder = new LockService({ client, keyPrefix: 'w:' });
  const locks = new LockService({
    client,
    keyPrefix: 'w:',
    maxWaiters: { perKey: maxWaiters, perProcess: maxWaiters },
  });
  const names = Array.from({ length: keys === 'one' ? 1 : n }, (_, i) => `k${i}`);
  const held: Lock[] = [];
  for (const name of names) held.push(await holder.acquire(name, { ttl: 60_000 }));
  global.gc?.();
  const heapBefore = process.memoryUsage().heapUsed;
  const controller = new AbortController();
  let refused = 0;
  let firstWoken = 0;
  const waits = Array.from({ length: n }, (_, i) =>
    locks
      .acquire(names[i % names.length], {
        ttl: 10_000,
        acquireTimeout: 30_000,
        ...(shared && { signal: controller.signal }),
      })
      .then(
        (lock) => {
          firstWoken ||= performance.now();
          return lock.release();
        },
        () => {
          refused++;
        },
      ),
  );
  await sleep(1_000); // every waiter subscribed and parked
  global.gc?.();
  const heap = process.memoryUsage().heapUsed - heapBefore;
  const delay = monitorEventLoopDelay({ resolution: 10 });
  delay.enable();
  const cpuBefore = process.cpuUsage();
  await sleep(2_000);
  const cpuUsed = process.cpuUsage(cpuBefore);
  delay.disable();
  const released = performance.now();
  await held[0].release();
  // Only the first key's waiters can go on; the others are cut short.
  if (keys === 'one') await Promise.all(waits);
  controller.abort();
  for (const lock of held.slice(1)) await lock.release();
  await Promise.all(waits);
  await locks.onApplicationShutdown();
  await holder.onApplicationShutdown();
  client.disconnect();
  return {
    heapPerWaiter: heap / n,
    delayP99: delay.percentile(99) / 1e6,
    cpu: (cpuUsed.user + cpuUsed.system) / 1e3 / 2_000,
    wake: firstWoken ? firstWoken - released : NaN,
    refused,
  };
}

const rows: string[] = [
  '| waiters | keys | shared signal | heap per waiter | event-loop delay p99 | CPU while parked | first wake after release | refused at once |',
  '| ---: | --- | --- | ---: | ---: | ---: | ---: | ---: |',
];
for (const n of sizes) {
  for (const [keys, shared] of [
    ['one', false],
    ['one', true],
    ['distinct', false],
  ] as const) {
    const samples: Sample[] = [];
    for (let round = 0; round < rounds; round++) samples.push(await measure(n, keys, shared));
    const pick = (field: keyof Sample): number => median(samples.map((sample) => sample[field]));
    rows.push(
      `| ${n.toLocaleString('en')} | ${keys} | ${shared ? 'yes' : 'no'} | ${(pick('heapPerWaiter') / 1024).toFixed(1)} kB | ${pick('delayP99').toFixed(1)} ms | ${(pick('cpu') * 100).toFixed(1)} % | ${pick('wake').toFixed(1)} ms | ${pick('refused')} |`,
    );
    console.log(rows.at(-1));
  }
}
console.log(`\n${rows.join('\n')}`);
await server.stop();
