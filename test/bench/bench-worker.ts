/**
 * One benchmark process: one contender, one workload (or this process's half of it), in a fresh
 * process. Prints its result as one JSON line. Redis commands are counted on the client, for the
 * lock's connection and every connection duplicated from it (a subscriber included).
 *
 * Usage: node bench-worker.js '<BenchJob as JSON>'
 */
import 'reflect-metadata';
import { Cluster, Redis } from 'ioredis';
import { setTimeout as sleep } from 'node:timers/promises';
import { READY, type BenchJob, type BenchResult, type SectionRecord } from './bench-protocol.js';
import { CONTENDERS, type Held } from './contenders.js';

const job = JSON.parse(process.argv[2]) as BenchJob;
const LOCK_CONNECTION = 'bench-lock';
/** Workload 6: locks held at once to measure the heap per held lock (a smoke run: its pairs). */
const HELD = Math.min(10_000, job.pairs);
let commands = 0;
const send = Redis.prototype.sendCommand;
Redis.prototype.sendCommand = function (this: Redis, ...args: Parameters<Redis['sendCommand']>) {
  if (this.options.connectionName === LOCK_CONNECTION) commands++;
  return send.apply(this, args);
};

const contender = CONTENDERS.find((c) => c.name === job.contender);
if (!contender) throw new Error(`no contender ${job.contender}`);
const lockOptions = { connectionName: LOCK_CONNECTION };
/**
 * The lock's connections (one server's; the Redlock nodes'; a Cluster client whose node
 * connections carry the lock's name), the data's (the hot key's counter, `INFO`), and one to
 * each server for its `INFO` (the Redis CPU a run cost is every server's).
 */
const nodes =
  job.topology === 'redlock'
    ? job.ports.map((port) => new Redis(port, '127.0.0.1', lockOptions))
    : job.topology === 'single'
      ? [new Redis(job.port, '127.0.0.1', lockOptions)]
      : [];
const cluster = (redisOptions = {}): Cluster =>
  new Cluster([{ host: '127.0.0.1', port: job.port }], { redisOptions });
const client = job.topology === 'cluster' ? cluster(lockOptions) : nodes[0];
const data = job.topology === 'cluster' ? cluster() : new Redis(job.port, '127.0.0.1');
const servers = job.ports.map((port) => new Redis(port, '127.0.0.1'));
const connections = [client, data, ...nodes, ...servers];
for (const connection of connections) connection.on('error', () => {});
await Promise.all(connections.map((connection) => connection.ping()));
const locker = await contender.create({ client, nodes });
const now = (): number => Number(process.hrtime.bigint()) / 1e6;
process.stdout.write(`${READY}\n`);
// The runner gone without a word: stop.
await new Promise<void>((resolve) => {
  process.stdin.once('data', () => resolve());
  process.stdin.once('end', () => process.exit(1));
});
process.stdin.destroy();

let result: BenchResult;
switch (job.workload) {
  case 'sequential':
    result = await sequential();
    break;
  case 'concurrent':
    result = await concurrent();
    break;
  case 'hot':
    result = await hot();
    break;
  case 'idle':
    result = await idle();
    break;
  case 'memory':
    result = await memory();
    break;
  case 'waiters':
    result = await waiters();
    break;
  case 'keys':
    result = await keys();
    break;
}
// A large result through a pipe is written asynchronously: exit only once it is out.
await new Promise<void>((resolve) =>
  process.stdout.write(`${JSON.stringify(result)}\n`, () => resolve()),
);
await locker.close();
for (const connection of connections) connection.disconnect();
process.exit(0);

/** Workload 1: one client acquires and releases one free key, `pairs` times in a row. */
async function sequential(): Promise<BenchResult> {
  // Warm up to steady state (the JIT has compiled every contender's hot path) before measuring
  // (a smoke run: as many as it measures).
  const warmUp = Math.min(2_000, job.pairs);
  for (let i = 0; i < warmUp; i++) await (await locker.acquire('seq', 10_000, 1_000)).release();
  return measured(async () => {
    for (let i = 0; i < job.pairs; i++)
      await (await locker.acquire('seq', 10_000, 1_000)).release();
    return job.pairs;
  });
}

/** Workload 2: 100 concurrent loops, each on a key of its own, for `durationMs`. */
async function concurrent(): Promise<BenchResult> {
  // Warmed up as workload 1 is: the JIT has compiled each contender's path before timing starts.
  await loops(Math.min(1_000, job.durationMs));
  return measured(() => loops(job.durationMs));
}

/**
 * Runs `work` (which resolves the pairs it did) and measures it: time, this process's CPU, the
 * Redis server's CPU and the lock's commands.
 */
async function measured(work: () => Promise<number>): Promise<BenchResult> {
  const start = commands;
  const redis0 = await redisCpuMs();
  const cpu = process.cpuUsage();
  const t0 = now();
  const ops = await work();
  const ms = now() - t0;
  const used = cpuMs(cpu);
  const redisCpu = (await redisCpuMs()) - redis0;
  return { ops, ms, cpuMs: used, redisCpuMs: redisCpu, commands: commands - start };
}

/** 100 loops acquiring and releasing a key of their own each for `ms`; returns the pairs done. */
async function loops(ms: number): Promise<number> {
  const end = now() + ms;
  let ops = 0;
  await Promise.all(
    Array.from({ length: 100 }, async (_, i) => {
      while (now() < end) {
        await (await locker.acquire(`own${i}`, 10_000, 1_000)).release();
        ops++;
      }
    }),
  );
  return ops;
}

/**
 * Workload 3: `workers` loops on one hot key for `durationMs`; each section reads a counter,
 * sleeps 1 ms and writes it back plus one (correct only under mutual exclusion).
 */
async function hot(): Promise<BenchResult> {
  const start = commands;
  const cpu = process.cpuUsage();
  const t0 = now();
  const end = t0 + job.durationMs;
  const sections: SectionRecord[] = [];
  const failedWaits: number[] = [];
  await Promise.all(
    Array.from({ length: job.workers }, async (_, worker) => {
      while (now() < end) {
        const called = now();
        let held;
        try {
          held = await locker.acquire('hot', 10_000, 30_000);
        } catch {
          failedWaits.push(now() - called);
          continue;
        }
        const enter = now();
        const value = Number(await data.get('counter'));
        await sleep(1);
        await data.set('counter', value + 1);
        const exit = now();
        await held.release();
        sections.push({ worker: `${job.proc}.${worker}`, enter, exit, wait: enter - called });
        if (job.thinkMs > 0) await sleep(job.thinkMs);
      }
    }),
  );
  return {
    ops: sections.length,
    ms: now() - t0,
    cpuMs: cpuMs(cpu),
    commands: commands - start,
    sections,
    failures: failedWaits.length,
    failedWaits,
  };
}

/** Workload 4: process 0 holds the key; both processes park `workers` waiters on it; count commands. */
async function idle(): Promise<BenchResult> {
  if (job.proc === 0) await locker.acquire('idle', 60_000, 1_000);
  await sleep(300);
  for (let i = 0; i < job.workers; i++) {
    locker.acquire('idle', 60_000, 60_000).catch(() => {});
  }
  // Waiters settle (subscribed, queued) before counting: 1 s (a smoke run, 0.3 s).
  await sleep(Math.min(1_000, job.durationMs));
  const start = commands;
  const t0 = now();
  await sleep(job.durationMs);
  return { ops: 0, ms: now() - t0, cpuMs: 0, commands: commands - start };
}

/**
 * Workload 6: `pairs` distinct keys acquired and released (100 at a time); the heap must come back,
 * and Redis keeps whatever the lock leaves per key. Then `HELD` locks held at once: heap per lock.
 */
async function memory(): Promise<BenchResult> {
  // Warm up every code path first, so the baseline heap includes what stays anyway.
  const warmUp = Math.min(1_000, job.pairs);
  for (let i = 0; i < warmUp; i++)
    await (await locker.acquire(`warm${i}`, 10_000, 1_000)).release();
  const keys0 = await data.dbsize();
  const redis0 = await redisMemory();
  const heap0 = await heap();
  let next = 0;
  await Promise.all(
    Array.from({ length: 100 }, async () => {
      while (next < job.pairs) await (await locker.acquire(`m${next++}`, 10_000, 1_000)).release();
    }),
  );
  const heap1 = await heap();
  const redis1 = await redisMemory();
  const keys1 = await data.dbsize();
  // Held locks: the handles (and whatever per-lock state the library keeps), 10,000 at once.
  const heldBase = await heap();
  const held = await Promise.all(
    Array.from({ length: HELD }, (_, i) => locker.acquire(`held${i}`, 60_000, 5_000)),
  );
  const heap2 = await heap();
  await Promise.all(held.map((lock) => lock.release()));
  return {
    ops: job.pairs,
    ms: 0,
    cpuMs: 0,
    commands: 0,
    memory: {
      heapGrowthPct: ((heap1 - heap0) / heap0) * 100,
      heapPerHeldLock: (heap2 - heldBase) / HELD,
      redisBytesPerKey: (redis1 - redis0) / job.pairs,
      keysLeft: keys1 - keys0,
    },
  };
}

/** The heap in use after a full collection (the worker runs with --expose-gc). */
async function heap(): Promise<number> {
  for (let i = 0; i < 3; i++) {
    globalThis.gc?.();
    await sleep(20);
  }
  return process.memoryUsage().heapUsed;
}

async function redisMemory(): Promise<number> {
  return Number(/used_memory:(\d+)/.exec(await data.info('memory'))![1]);
}

/**
 * Waiters workload: the key held, `workers` waiters parked on it one after another (each asks
 * once the previous one's request is out), left 1 s to settle; then the commands they cost over
 * `durationMs` and the heap they take; then the key released and each waiter, once granted,
 * releasing at once: how long until the last one had it, and in what order they got it.
 */
async function waiters(): Promise<BenchResult> {
  // Warm the paths up (a waiter granted, released) so the heap baseline includes them.
  const warm = await locker.acquire('warm', 60_000, 1_000);
  const warmWaiter = locker.acquire('warm', 60_000, 5_000);
  await sleep(20);
  await warm.release();
  await (await warmWaiter).release();

  const holder = await locker.acquire('waited', 60_000, 1_000);
  const heap0 = await heap();
  const granted: number[] = [];
  let lastGrant = 0;
  const parked: Promise<void>[] = [];
  for (let i = 0; i < job.workers; i++) {
    parked.push(
      locker.acquire('waited', 60_000, 120_000).then(async (held) => {
        granted.push(i);
        lastGrant = now();
        await held.release();
      }),
    );
    await new Promise((resolve) => setImmediate(resolve));
  }
  await sleep(Math.min(1_000, job.durationMs));
  const heap1 = await heap();
  const start = commands;
  const t0 = now();
  await sleep(job.durationMs);
  const parkedCommandsPerSec = ((commands - start) * 1_000) / (now() - t0);
  const released = now();
  await holder.release();
  const failed = (await Promise.allSettled(parked)).filter((r) => r.status === 'rejected').length;
  const inOrder = granted.filter((waiter, i) => waiter === i).length;
  return {
    ops: granted.length,
    ms: 0,
    cpuMs: 0,
    commands: 0,
    failures: failed,
    waiters: {
      parkedCommandsPerSec,
      heapPerWaiter: (heap1 - heap0) / job.workers,
      drainMs: lastGrant - released,
      inOrderPct: (100 * inOrder) / job.workers,
    },
  };
}

/**
 * Keys workload: `pairs` distinct keys locked and held at once (100 at a time); the client heap
 * and Redis memory they take; then all released, and what Redis keeps of them.
 */
async function keys(): Promise<BenchResult> {
  for (let i = 0; i < 1_000; i++)
    await (await locker.acquire(`warm${i}`, 600_000, 1_000)).release();
  const keys0 = await data.dbsize();
  const redis0 = await redisMemory();
  const heap0 = await heap();
  const held: Held[] = new Array<Held>(job.pairs);
  let next = 0;
  await Promise.all(
    Array.from({ length: 100 }, async () => {
      while (next < job.pairs) {
        const i = next++;
        held[i] = await locker.acquire(`k${i}`, 600_000, 5_000);
      }
    }),
  );
  const heap1 = await heap();
  const redis1 = await redisMemory();
  let done = 0;
  await Promise.all(
    Array.from({ length: 100 }, async () => {
      while (done < job.pairs) await held[done++].release();
    }),
  );
  held.fill(undefined as unknown as Held);
  const redis2 = await redisMemory();
  const keys2 = await data.dbsize();
  return {
    ops: job.pairs,
    ms: 0,
    cpuMs: 0,
    commands: 0,
    keys: {
      heapPerLock: (heap1 - heap0) / job.pairs,
      redisBytesPerLock: (redis1 - redis0) / job.pairs,
      keysLeftPerLock: (keys2 - keys0) / job.pairs,
      redisBytesLeftPerLock: (redis2 - redis0) / job.pairs,
    },
  };
}

/**
 * The Redis server's CPU time so far (ms, `INFO cpu`: user + system, its main thread included):
 * read before and after a run of one process against an otherwise idle server, the difference is
 * what that run cost Redis, scripts, parsing and replies included.
 */
async function redisCpuMs(): Promise<number> {
  const infos = await Promise.all(servers.map((server) => server.info('cpu')));
  const field = (info: string, name: string): number =>
    Number(new RegExp(`${name}:([\\d.]+)`).exec(info)![1]);
  const cpu = infos.map((info) => field(info, 'used_cpu_user') + field(info, 'used_cpu_sys'));
  return cpu.reduce((sum, ms) => sum + ms, 0) * 1_000;
}

function cpuMs(since: NodeJS.CpuUsage): number {
  const used = process.cpuUsage(since);
  return (used.user + used.system) / 1_000;
}
