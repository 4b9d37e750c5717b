/**
 * `npm run bench`: starts its own redis-server on a free loopback port, runs every workload for
 * every contender in the same run, interleaved over several rounds (contender order rotated each
 * round, every run in fresh processes), and prints and writes a markdown report of medians and of
 * ratios to the hand-written minimum (medians of per-round ratios: the machine is shared and noisy).
 *
 * Options: --rounds N (3; the scaling workloads 2 unless it is given), --only a,b (contenders whose
 * name contains one of these; `--only redlock` or `--only cluster` alone: that section alone, every
 * contender of it), --workloads a,b (all),
 * --report <path> (test/bench/REPORT.md, and chart.svg beside it; `-` for none), --smoke (every
 * workload at a tiny size, runs of 0.3 s and HTTP loads of 1 s: checks that the benchmark works,
 * measures nothing; `test/bench/bench.spec.ts` runs it). `BENCH_BASELINE=<another build's
 * lib/index.js>` adds that build of this library as a contender (see `contenders.ts`).
 */
import autocannon from 'autocannon';
import { execFileSync, spawn } from 'node:child_process';
import { writeFileSync } from 'node:fs';
import { writeMarkdown } from '../support/markdown.js';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';
import { Cluster, Redis } from 'ioredis';
import { percentile } from '../chaos/chaos-checker.js';
import { startCluster, startRedis, type RedisServer } from '../support/redis-server.js';
import {
  READY,
  type BenchJob,
  type BenchResult,
  type SectionRecord,
  type Topology,
  type Workload,
} from './bench-protocol.js';
import { renderChart, renderScaleChart } from './bench-chart.js';
import { CONTENDERS, type Contender } from './contenders.js';

const { values } = parseArgs({
  options: {
    rounds: { type: 'string' },
    only: { type: 'string' },
    workloads: { type: 'string' },
    report: { type: 'string', default: 'test/bench/REPORT.md' },
    smoke: { type: 'boolean', default: false },
  },
});
/** A smoke run's job: the workload's shape at a tiny size. */
const sized = (job: WorkloadPlan['job']): WorkloadPlan['job'] =>
  values.smoke
    ? { ...job, pairs: Math.min(job.pairs, 300), durationMs: Math.min(job.durationMs, 300) }
    : job;
const rounds = Number(values.rounds ?? 3);
const worker = fileURLToPath(new URL('./bench-worker.js', import.meta.url));
const appServer = fileURLToPath(new URL('./bench-app.js', import.meta.url));
const BASELINE = CONTENDERS[0].name;

interface WorkloadPlan {
  id: string;
  title: string;
  workload: Workload;
  processes: number;
  job: Pick<BenchJob, 'pairs' | 'durationMs' | 'workers' | 'thinkMs'>;
  /**
   * Runs of every contender per round (default 1), the order rotated again for each: the short
   * uncontended runs swing by up to 2× from one process to the next on this shared machine
   * (whatever the contender), so they get more samples for their medians.
   */
  runsPerRound?: number;
  /** Selects it with `--workloads <group>` as well as by id (the scaling workloads: `scale`). */
  group?: string;
  /** Runs only these contenders (the scaling workloads: see SCALE_CONTENDERS). */
  contenders?: readonly string[];
  /** Runs in at most this many rounds. */
  rounds?: number;
  /** Where it runs (default: one server): the Redlock and Cluster sections. */
  topology?: Topology;
  /** What its ratios are to (default: the hand-written minimum). */
  baseline?: string;
}

/**
 * The scaling workloads run the minimum, ours, the peer that sends the minimum's commands
 * (redis-semaphore) and the best redlock variant on the hot key (@sesamecare-oss/redlock with a
 * 10 ms retry: 0.95-1.10x the minimum in workload 3), in 2 rounds: the whole `npm run bench` stays
 * near 30 minutes.
 */
const SCALE_CONTENDERS = [
  'hand-written minimum',
  'nestjs-redis-lock',
  'redis-semaphore',
  '@sesamecare-oss/redlock (10 ms)',
];
/** BENCH_TURNS: ours with other handoff turns (see contenders.ts), on the hot key only. */
const TURN_CONTENDERS = CONTENDERS.filter((c) => c.name.includes('(handoffTurn')).map(
  (c) => c.name,
);
const SCALE_ROUNDS = 2;
const SCALE_PROCESSES = [2, 4, 8];
const scale = (plan: Omit<WorkloadPlan, 'group' | 'contenders' | 'rounds'>): WorkloadPlan => ({
  ...plan,
  group: 'scale',
  contenders:
    plan.workload === 'hot'
      ? [...SCALE_CONTENDERS.slice(0, 2), ...TURN_CONTENDERS, ...SCALE_CONTENDERS.slice(2)]
      : SCALE_CONTENDERS,
  // An explicit --rounds applies to them too (to choose a handoffTurn on more rounds).
  rounds: values.rounds === undefined ? SCALE_ROUNDS : undefined,
});

/** The Redlock section's ratios are to the Redlock library the others would pick first. */
const REDLOCK_BASELINE = '@sesamecare-oss/redlock (defaults)';

/** Workloads 1–4 on one server, which the Redlock and Cluster sections run again. */
const PLANS_ONE_SERVER: WorkloadPlan[] = [
  {
    id: 'sequential',
    title: '1. Sequential acquire + release of one free key, 1 client, 5,000 pairs',
    workload: 'sequential',
    processes: 1,
    job: { pairs: 5_000, durationMs: 0, workers: 1, thinkMs: 0 },
    runsPerRound: 3,
  },
  {
    id: 'concurrent',
    title: '2. 100 concurrent loops, a key of their own each, 5 s',
    workload: 'concurrent',
    processes: 1,
    job: { pairs: 0, durationMs: 5_000, workers: 100, thinkMs: 0 },
  },
  {
    id: 'hot-0',
    title: '3a. Hot key, 2 processes × 10 workers, 1 ms section, no think time, 10 s',
    workload: 'hot',
    processes: 2,
    job: { pairs: 0, durationMs: 10_000, workers: 10, thinkMs: 0 },
  },
  {
    id: 'hot-5',
    title: '3b. Hot key, 2 processes × 10 workers, 1 ms section, 5 ms think time, 10 s',
    workload: 'hot',
    processes: 2,
    job: { pairs: 0, durationMs: 10_000, workers: 10, thinkMs: 5 },
  },
  {
    id: 'idle',
    title:
      '4. 100 idle waiters (2 processes × 50) on a key held throughout: Redis commands per second',
    workload: 'idle',
    processes: 2,
    // Waiters' commands per second are steady once they are parked: 2 s (after 1 s to settle) read
    // them as well as longer windows did (5 s until stop 18), for 10 contenders × rounds.
    job: { pairs: 0, durationMs: 2_000, workers: 50, thinkMs: 0 },
  },
];

const PLANS: WorkloadPlan[] = [
  ...PLANS_ONE_SERVER,
  {
    id: 'memory',
    title:
      '6. Memory: 100,000 distinct keys acquired and released (heap growth, Redis bytes and keys left per key), then 10,000 locks held (heap per lock)',
    workload: 'memory',
    processes: 1,
    job: { pairs: 100_000, durationMs: 0, workers: 100, thinkMs: 0 },
  },
  ...[0, 5].flatMap((thinkMs) =>
    SCALE_PROCESSES.map((processes) =>
      scale({
        id: `instances-${processes}-${thinkMs}`,
        title: `7. Instances: hot key, ${processes} processes × 10 workers, 1 ms section, ${thinkMs} ms think time, 5 s`,
        workload: 'hot',
        processes,
        job: { pairs: 0, durationMs: 5_000, workers: 10, thinkMs },
      }),
    ),
  ),
  ...[10, 100, 1_000].map((workers) =>
    scale({
      id: `waiters-${workers}`,
      title: `8. Waiters: ${workers.toLocaleString('en-US')} waiters parked on one held key in one process for 2 s, then the key released (each waiter releases at once)`,
      workload: 'waiters',
      processes: 1,
      job: { pairs: 0, durationMs: 2_000, workers, thinkMs: 0 },
    }),
  ),
  ...[1_000, 100_000, 1_000_000].map((pairs) =>
    scale({
      id: `keys-${pairs}`,
      title: `9. Keys: ${pairs.toLocaleString('en-US')} distinct keys held at once, then released`,
      workload: 'keys',
      processes: 1,
      job: { pairs, durationMs: 0, workers: 100, thinkMs: 0 },
    }),
  ),
  ...sectionPlans('redlock', 'R', 'Redlock, 3 independent masters', REDLOCK_BASELINE, [
    'sequential',
    'concurrent',
    'hot-0',
    'hot-5',
    'idle',
  ]),
  ...sectionPlans('cluster', 'C', 'Cluster, 3 masters', BASELINE, ['concurrent', 'hot-0', 'hot-5']),
];

/**
 * The Redlock and Cluster sections: workloads of one server's list (`ids`), on that topology,
 * with its contenders, their ratios to `baseline`; hot keys 5 s, so that the whole run stays near
 * its 35 minutes. Selected with `--workloads redlock` (or `cluster`), or `--only` the same.
 */
function sectionPlans(
  topology: Topology,
  letter: string,
  where: string,
  baseline: string,
  ids: string[],
): WorkloadPlan[] {
  return ids.map((id, i) => {
    const plan = PLANS_ONE_SERVER.find((p) => p.id === id)!;
    const hot = plan.workload === 'hot';
    const title = plan.title.replace(/^\d+[a-z]?\. /, '').replace(/, 10 s$/, ', 5 s');
    return {
      ...plan,
      id: `${topology}-${id}`,
      title: `${letter}${i + 1}. ${where}: ${title} (ratios to ${baseline})`,
      job: hot ? { ...plan.job, durationMs: 5_000 } : plan.job,
      group: topology,
      topology,
      baseline,
    };
  });
}

/** Workload 5: the sample app's purchase route, locked and unlocked, under autocannon. */
type HttpRoute = 'purchase-unlocked' | 'purchase' | 'purchase-once' | 'purchase-minimum';
interface HttpVariant {
  id: string;
  route: HttpRoute;
  /** `distinct`: a different SKU per request (1,000 in turn); `hot`: every request on one. */
  keys: 'distinct' | 'hot';
  connections: number;
}
const HTTP_SECONDS = values.smoke ? 1 : 5;
const HTTP_ROUTES: readonly { route: HttpRoute; name: string }[] = [
  { route: 'purchase-unlocked', name: 'no lock' },
  { route: 'purchase', name: '`@WithLock`' },
  { route: 'purchase-once', name: '`@WithLock`, no re-entry' },
  { route: 'purchase-minimum', name: 'hand-written minimum lock' },
];
const HTTP_VARIANTS: HttpVariant[] = (['distinct', 'hot'] as const).flatMap((keys) =>
  HTTP_ROUTES.map(({ route }) => ({
    id: `${keys}-${route}`,
    route,
    keys,
    connections: keys === 'hot' ? 10 : 1,
  })),
);
const HTTP_TITLE = `5. \`@WithLock\` overhead: the sample app's \`POST /products/:sku/purchase\` (\`@WithLock\`, its provider method re-entering the lock) against \`purchase-unlocked\` (the same handler, no lock), the same purchase under one \`@WithLock\` and under the hand-written minimum lock, autocannon, ${HTTP_SECONDS} s each`;

/**
 * Pins every thread of process `pid` to `cpus` (a \`taskset\` list); false if \`taskset\` fails.
 * Workload 5 gives the app a CPU of its own, Redis and the load generator another, where this
 * process may run on two or more: left to the scheduler, where the three land moved the same
 * route's p50 by up to 2× between runs, more than the lock's cost being measured.
 */
function pin(pid: number, cpus: string): boolean {
  try {
    execFileSync('taskset', ['-apc', cpus, String(pid)], { stdio: 'ignore' });
    return true;
  } catch {
    return false;
  }
}
/** The CPUs this process may run on (`taskset -pc`'s list, as `0-3,6`), or none without taskset. */
function allowedCpus(): { list: string; cpus: number[] } | undefined {
  try {
    const list = /: *([\d,-]+)\s*$/.exec(
      execFileSync('taskset', ['-pc', String(process.pid)], { encoding: 'utf8' }),
    )![1];
    const cpus = list.split(',').flatMap((part) => {
      const [from, to = from] = part.split('-').map(Number);
      return Array.from({ length: to - from + 1 }, (_, i) => from + i);
    });
    return { list, cpus };
  } catch {
    return undefined;
  }
}
let httpPinned = false;

/** The figures of one run of one contender on one workload. */
type Figures = Record<string, number>;

/** `--only redlock` / `--only cluster`: that section alone (see the options). */
const SECTIONS: readonly string[] = ['redlock', 'cluster'];
const onlySection = SECTIONS.includes(values.only ?? '') ? values.only : undefined;
const wanted = (id: string, group?: string): boolean =>
  (onlySection === undefined || group === onlySection) &&
  (values.workloads === undefined ||
    values.workloads.split(',').some((name) => name === id || name === group));
/** A smoke run takes the smallest size of each scaling workload only (it measures nothing). */
const SMOKE_SCALE = ['instances-2-5', 'waiters-10', 'keys-1000'];
const plans = PLANS.filter(
  (p) =>
    wanted(p.id, p.group) && (!values.smoke || p.group !== 'scale' || SMOKE_SCALE.includes(p.id)),
);
const runHttp = wanted('http');
/** httpResults[variant] = figures of each round */
const httpResults = new Map<string, Figures[]>();
const contenders = CONTENDERS.filter(
  (c) =>
    c.name === BASELINE ||
    c.name === REDLOCK_BASELINE ||
    values.only === undefined ||
    onlySection !== undefined ||
    values.only.split(',').some((text) => c.name.includes(text)),
);
/**
 * A retry variant differs from its library's defaults only in how it waits: where nobody waits
 * (workloads 1, 2 and 6) it runs the same code, so it is not run again there.
 */
const runs = (plan: WorkloadPlan, contender: Contender): boolean =>
  on(plan, contender) &&
  // (A smoke run's sections leave the retry variants out: a Redlock library polling every 10 ms
  // can wait out a lock's TTL, 10 s, and a smoke run measures nothing.)
  !(values.smoke && plan.topology !== undefined && contender.retryVariant === true) &&
  (plan.contenders !== undefined
    ? plan.contenders.includes(contender.name)
    : contender.retryVariant !== true || plan.workload === 'hot' || plan.workload === 'idle') &&
  (contender.workloads === undefined || contender.workloads.includes(plan.workload));
/** Whether `contender` runs on `plan`'s topology at all (its section's table lists only those). */
function on(plan: WorkloadPlan, contender: Contender): boolean {
  return (contender.topologies ?? ['single']).includes(plan.topology ?? 'single');
}

/** Where a run goes: its servers' ports (the first the one to connect to), emptied before each run. */
interface Lane {
  readonly ports: number[];
  /** Empties every server. */
  flush(): Promise<void>;
  /** The hot-key workload's counter. */
  counter(): Promise<number>;
  stop(): Promise<void>;
}
const serverLane = (servers: RedisServer[]): Lane => {
  const admins = servers.map((server) => new Redis(server.port, server.host));
  return {
    ports: servers.map((server) => server.port),
    flush: async () => void (await Promise.all(admins.map((admin) => admin.flushall()))),
    counter: async () => Number(await admins[0].get('counter')),
    stop: async () => {
      for (const admin of admins) admin.disconnect();
      await Promise.all(servers.map((server) => server.stop()));
    },
  };
};
const server = await startRedis();
const admin = new Redis(server.port, server.host);
/**
 * Where runs go: one Redis. A smoke run measures nothing, so its runs go two at a time (one per
 * core), each lane on a Redis of its own.
 */
const lanes = [serverLane([server])];
if (values.smoke && plans.some((plan) => plan.topology === undefined)) {
  lanes.push(serverLane([await startRedis()]));
}
/** The Redlock section's three masters and the Cluster section's Cluster, if asked for. */
const sectionLanes = new Map<Topology, Lane>();
if (plans.some((plan) => plan.topology === 'redlock')) {
  sectionLanes.set('redlock', serverLane(await Promise.all([0, 1, 2].map(() => startRedis()))));
}
if (plans.some((plan) => plan.topology === 'cluster')) {
  const fixture = await startCluster(3);
  const masters = fixture.nodes.map((node) => new Redis(node.port, node.host));
  const cluster = new Cluster([{ host: '127.0.0.1', port: fixture.nodes[0].port }]);
  sectionLanes.set('cluster', {
    ports: fixture.nodes.map((node) => node.port),
    flush: async () => void (await Promise.all(masters.map((master) => master.flushall()))),
    counter: async () => Number(await cluster.get('counter')),
    stop: async () => {
      cluster.disconnect();
      for (const master of masters) master.disconnect();
      await fixture.stop();
    },
  });
}
/** results[plan][contender] = figures of each round */
const results = new Map<string, Map<string, Figures[]>>();
const started = performance.now();
/** Seconds each workload took over all rounds, process start-ups included. */
const spent = new Map<string, number>();
const timed = async (id: string, work: () => Promise<void>): Promise<void> => {
  const start = performance.now();
  await work();
  spent.set(id, (spent.get(id) ?? 0) + (performance.now() - start) / 1_000);
};
try {
  for (let round = 0; round < rounds; round++) {
    for (const plan of plans) {
      if (round < (plan.rounds ?? rounds)) await timed(plan.id, () => runPlan(round, plan));
    }
    if (runHttp) await timed('http', () => httpRound(round));
  }
} finally {
  admin.disconnect();
  for (const lane of [...lanes, ...sectionLanes.values()]) await lane.stop();
}
const report = render((performance.now() - started) / 1_000);
console.log(`\n${report}`);
// A smoke run measures nothing: it never overwrites the report.
if (values.report !== '-' && !values.smoke) {
  await writeMarkdown(values.report, report);
  const hot = plans.find((p) => p.id === 'hot-5');
  if (hot) {
    const chart = renderChart(
      contenders
        .filter((c) => runs(hot, c))
        .map((c) => ({
          name: c.name,
          handoffP50: summarize(hot, c.name, 'handoffP50').median,
          handoffP99: summarize(hot, c.name, 'handoffP99').median,
          commandsPerSection: summarize(hot, c.name, 'commandsPerSection').median,
        })),
      `npm run bench, ${new Date().toISOString().slice(0, 10)}: medians of ${rounds} rounds, redis-server 7 on loopback, 2 cores`,
    );
    writeFileSync(join(dirname(values.report), 'chart.svg'), chart);
  }
  const instances = plans.filter((p) => p.id.startsWith('instances-'));
  if (instances.length > 0) {
    const chart = renderScaleChart(
      [0, 5]
        .map((thinkMs) => ({
          title: `${thinkMs} ms think time`,
          // Those that ran (`--only` may leave some out), BENCH_TURNS' among them.
          series: instances[0]
            .contenders!.filter((name) => instances.every((p) => results.get(p.id)?.has(name)))
            .map((name) => ({
              name,
              points: instances
                .filter((p) => p.job.thinkMs === thinkMs)
                .map((p) => ({
                  processes: p.processes,
                  waitP99: summarize(p, name, 'waitP99').median,
                  commandsPerSection: summarize(p, name, 'commandsPerSection').median,
                })),
            }))
            .filter((s) => s.points.length > 0),
        }))
        .filter((row) => row.series.length > 0),
      `npm run bench -- --workloads scale, ${new Date().toISOString().slice(0, 10)}: medians of ${values.rounds ?? SCALE_ROUNDS} rounds, redis-server 7 on loopback, 2 cores`,
    );
    writeFileSync(join(dirname(values.report), 'scale.svg'), chart);
  }
}

/** Every contender's runs of `plan` in round `round`, the order rotated for each repetition. */
async function runPlan(round: number, plan: WorkloadPlan): Promise<void> {
  const repeats = values.smoke ? 1 : (plan.runsPerRound ?? 1);
  for (let repeat = 0; repeat < repeats; repeat++) {
    const shift = round * repeats + repeat;
    const order = contenders
      .map((_, i) => contenders[(i + shift) % contenders.length])
      .filter((c) => runs(plan, c));
    const planLanes = plan.topology ? [sectionLanes.get(plan.topology)!] : lanes;
    await Promise.all(
      planLanes.map(async (lane, l) => {
        for (let i = l; i < order.length; i += planLanes.length) {
          const contender = order[i];
          await lane.flush();
          const outputs = await runOnce(plan, contender.name, lane.ports);
          const figures = measure(plan, outputs, await lane.counter());
          const byContender = results.get(plan.id) ?? new Map<string, Figures[]>();
          byContender.set(contender.name, [...(byContender.get(contender.name) ?? []), figures]);
          results.set(plan.id, byContender);
          console.log(
            `round ${round + 1} ${plan.id} ${contender.name}: ${JSON.stringify(figures)}`,
          );
        }
      }),
    );
  }
}

async function runOnce(
  plan: WorkloadPlan,
  contender: string,
  ports: number[],
): Promise<BenchResult[]> {
  const children = Array.from({ length: plan.processes }, (_, proc) => {
    const job: BenchJob = {
      contender,
      workload: plan.workload,
      topology: plan.topology ?? 'single',
      port: ports[0],
      ports,
      proc,
      ...sized(plan.job),
    };
    const child = spawn(process.execPath, ['--expose-gc', worker, JSON.stringify(job)], {
      stdio: ['pipe', 'pipe', 'inherit'],
    });
    let output = '';
    let announceReady: () => void;
    const ready = new Promise<void>((resolve) => (announceReady = resolve));
    child.stdout.on('data', (chunk: Buffer) => {
      output += chunk.toString();
      if (output.startsWith(`${READY}\n`)) announceReady();
    });
    const result = new Promise<BenchResult>((resolve, reject) => {
      child.once('exit', (code) => {
        const line = output.trim().split('\n').pop() ?? '';
        if (code === 0 && line.startsWith('{')) resolve(JSON.parse(line) as BenchResult);
        else
          reject(
            new Error(
              `${contender} ${plan.id} process ${proc} exited ${code}: ${output.slice(-500)}`,
            ),
          );
      });
    });
    return { child, ready: Promise.race([ready, result.then(() => {})]), result };
  });
  // Every process connected and set up: start them together.
  try {
    await Promise.all(children.map((c) => c.ready));
  } catch (error) {
    for (const { child, result } of children) {
      result.catch(() => {});
      child.kill();
    }
    throw error;
  }
  for (const { child } of children) child.stdin.end('go\n');
  return Promise.all(children.map((c) => c.result));
}

/** One round of workload 5: a fresh app process, the variants in rotated order. */
async function httpRound(round: number): Promise<void> {
  await admin.flushall();
  const app = spawn(process.execPath, [appServer, String(server.port)], {
    stdio: ['pipe', 'pipe', 'inherit'],
  });
  const allowed = allowedCpus();
  try {
    const [appCpu, otherCpu] = allowed?.cpus ?? [];
    httpPinned =
      otherCpu !== undefined &&
      pin(app.pid!, String(appCpu)) &&
      pin(server.pid, String(otherCpu)) &&
      pin(process.pid, String(otherCpu));
    const port = await new Promise<number>((resolve, reject) => {
      let output = '';
      app.stdout.on('data', (chunk: Buffer) => {
        output += chunk.toString();
        const line = /^\{.*\}$/m.exec(output);
        if (line) resolve((JSON.parse(line[0]) as { port: number }).port);
      });
      app.once('exit', (code) => reject(new Error(`bench app exited ${code}: ${output}`)));
    });
    // Warm up (not in a smoke run, which measures nothing).
    if (!values.smoke) for (const variant of HTTP_VARIANTS) await load(port, variant, 1);
    // The floor under any lock's cost: the round trip to Redis from this machine, right now.
    const rtts: number[] = [];
    for (let i = 0; i < 500; i++) {
      const sent = performance.now();
      await admin.ping();
      rtts.push(performance.now() - sent);
    }
    httpResults.set('rtt', [...(httpResults.get('rtt') ?? []), { p50: percentile(rtts, 50) }]);
    const order = HTTP_VARIANTS.map((_, i) => HTTP_VARIANTS[(i + round) % HTTP_VARIANTS.length]);
    for (const variant of order) {
      const figures = await load(port, variant, HTTP_SECONDS);
      httpResults.set(variant.id, [...(httpResults.get(variant.id) ?? []), figures]);
      console.log(`round ${round + 1} http ${variant.id}: ${JSON.stringify(figures)}`);
    }
  } finally {
    app.stdin.end();
    await new Promise((resolve) => app.once('exit', resolve));
    if (allowed) {
      pin(server.pid, allowed.list);
      pin(process.pid, allowed.list);
    }
  }
}

/** Drives one variant for `seconds`; latencies are taken exactly (autocannon's histogram rounds to whole ms). */
function load(port: number, variant: HttpVariant, seconds: number): Promise<Figures> {
  const latencies: number[] = [];
  let next = 0;
  return new Promise<Figures>((resolve, reject) => {
    const instance = autocannon(
      {
        url: `http://127.0.0.1:${port}`,
        connections: variant.connections,
        duration: seconds,
        requests: [
          {
            method: 'POST',
            headers: { 'content-type': 'application/json' },
            body: '{"quantity":1}',
            setupRequest: (request) => ({
              ...request,
              path: `/products/${variant.keys === 'hot' ? 'hot' : `d${next++ % 1_000}`}/${variant.route}`,
            }),
          },
        ],
      },
      (error, result) => {
        if (error) return reject(error as Error);
        resolve({
          reqPerSec: latencies.length / result.duration,
          p50: percentile(latencies, 50),
          p99: percentile(latencies, 99),
          failed: result.non2xx + result.errors,
        });
      },
    );
    instance.on('response', (_client, status, _bytes, time) => {
      if (status < 300) latencies.push(time);
    });
  });
}

function measure(plan: WorkloadPlan, outputs: BenchResult[], counter: number): Figures {
  const ops = outputs.reduce((sum, r) => sum + r.ops, 0);
  const commands = outputs.reduce((sum, r) => sum + r.commands, 0);
  const cpuMs = outputs.reduce((sum, r) => sum + r.cpuMs, 0);
  const seconds = Math.max(...outputs.map((r) => r.ms)) / 1_000;
  switch (plan.workload) {
    case 'sequential':
    case 'concurrent':
      return {
        opsPerSec: ops / seconds,
        cpuUsPerOp: (cpuMs * 1_000) / ops,
        redisCpuUsPerOp: (outputs[0].redisCpuMs! * 1_000) / ops,
        commandsPerOp: commands / ops,
      };
    case 'idle':
      return { commandsPerSec: commands / seconds };
    case 'memory':
      return { ...outputs[0].memory!, keysLeftPerKey: outputs[0].memory!.keysLeft / ops };
    case 'waiters':
      return { ...outputs[0].waiters!, failures: outputs[0].failures ?? 0 };
    case 'keys':
      return { ...outputs[0].keys! };
    case 'hot': {
      const sections = outputs.flatMap((r) => r.sections ?? []).sort((a, b) => a.enter - b.enter);
      const gaps = sections.slice(1).map((s, i) => s.enter - sections[i].exit);
      // Split by whether the lock stayed in its process or went to the other one.
      const processOf = (s: SectionRecord): string => s.worker.slice(0, s.worker.indexOf('.'));
      const within: number[] = [];
      const between: number[] = [];
      sections.slice(1).forEach((s, i) => {
        (processOf(s) === processOf(sections[i]) ? within : between).push(gaps[i]);
      });
      const perWorker = new Map<string, number>();
      for (const s of sections) perWorker.set(s.worker, (perWorker.get(s.worker) ?? 0) + 1);
      const counts = [...perWorker.values()];
      // A failed acquisition waited too: in the waits, not out of them.
      const waits = [
        ...sections.map((s) => s.wait),
        ...outputs.flatMap((r) => r.failedWaits ?? []),
      ];
      return {
        opsPerSec: sections.length / seconds,
        lostUpdates: sections.length - counter,
        handoffP50: percentile(gaps, 50),
        handoffP99: percentile(gaps, 99),
        withinP50: percentile(within, 50),
        withinP99: percentile(within, 99),
        betweenP50: percentile(between, 50),
        betweenP99: percentile(between, 99),
        betweenPct: (100 * between.length) / Math.max(1, gaps.length),
        waitP50: percentile(waits, 50),
        waitP99: percentile(waits, 99),
        waitMax: Math.max(0, ...waits),
        workerMin: counts.length < plan.processes * plan.job.workers ? 0 : Math.min(...counts),
        workerMax: Math.max(0, ...counts),
        commandsPerSection: commands / Math.max(1, sections.length),
        failures: outputs.reduce((sum, r) => sum + (r.failures ?? 0), 0),
      };
    }
  }
}

function median(values: number[]): number {
  return percentile(values, 50);
}

function fmt(value: number, digits = 2): string {
  if (!Number.isFinite(value)) return '—';
  return Math.abs(value) >= 100 ? value.toFixed(0) : value.toFixed(digits);
}

/** Median over rounds of a figure, and of its per-round ratio to the baseline's. */
function summarize(
  plan: WorkloadPlan,
  contender: string,
  field: string,
): { median: number; ratio: number } {
  const own = results.get(plan.id)!.get(contender)!;
  const base = results.get(plan.id)!.get(plan.baseline ?? BASELINE)!;
  return {
    median: median(own.map((f) => f[field])),
    ratio: median(own.map((f, i) => f[field] / base[i][field])),
  };
}

function markdownTable(header: string[], rows: string[][]): string {
  return [header, header.map(() => '---'), ...rows].map((r) => `| ${r.join(' | ')} |`).join('\n');
}

function renderHttp(): string {
  const rounds = (id: string): Figures[] => httpResults.get(id)!;
  const m = (id: string, field: string): number => median(rounds(id).map((f) => f[field]));
  /** Median over rounds of this variant's figure against the unlocked one's, measured in the same app. */
  const against = (
    variant: HttpVariant,
    field: string,
    compare: (own: number, unlocked: number) => number,
  ): number => {
    const unlocked = rounds(`${variant.keys}-purchase-unlocked`);
    return median(rounds(variant.id).map((f, i) => compare(f[field], unlocked[i][field])));
  };
  const rows = HTTP_VARIANTS.map((variant) => {
    const base = variant.route === 'purchase-unlocked';
    const ratio = against(variant, 'reqPerSec', (own, unlocked) => own / unlocked);
    const added = (field: string): string =>
      fmt(against(variant, field, (own, unlocked) => own - unlocked));
    return [
      `${variant.keys === 'hot' ? 'one hot SKU, 10 connections' : 'a different SKU per request, 1 connection'}`,
      HTTP_ROUTES.find((r) => r.route === variant.route)!.name,
      base
        ? fmt(m(variant.id, 'reqPerSec'))
        : `${fmt(m(variant.id, 'reqPerSec'))} (${fmt(ratio)}×)`,
      `${fmt(m(variant.id, 'p50'))} / ${fmt(m(variant.id, 'p99'))}`,
      base ? '—' : `${added('p50')} / ${added('p99')}`,
      fmt(m(variant.id, 'failed')),
    ];
  });
  const header = [
    'requests',
    'route',
    'req/s (ratio to no lock)',
    'p50 / p99 ms',
    'added p50 / p99 ms',
    'failed requests',
  ];
  const table = markdownTable(header, rows);
  const rtt = fmt(m('rtt', 'p50'), 3);
  return `### ${HTTP_TITLE} (${took('http')})\n\n${table}\n\nA Redis round trip (\`PING\` from the load generator's process, p50) took ${rtt} ms in this run${httpPinned ? ' (the app on one CPU, Redis and the load generator on the other)' : ' (processes not pinned to CPUs: `taskset` missing or one CPU)'}: a locked request makes two more (acquire, release), whichever lock it uses. On one hot SKU the unlocked route oversells (its read-modify-write races); a locked one serializes the purchases, so its rate is that of one purchase at a time (the hand-written minimum polls every 10 ms for it).\n`;
}

/** How long a workload took in this run, start-ups included. */
function took(id: string): string {
  return `${Math.round(spent.get(id) ?? 0)} s in all`;
}

function render(seconds: number): string {
  const sections = plans.map((plan) => {
    const rows = contenders
      .filter((c) => on(plan, c) && (!plan.contenders || runs(plan, c)))
      .map((c) => {
        if (!runs(plan, c)) {
          const why = c.retryVariant
            ? 'same code as its defaults when nobody waits: not run'
            : `a variant run only in the ${c.workloads!.join(' and ')} workload(s)`;
          return [c.name, why];
        }
        const cell = (field: string, withRatio = false): string => {
          const { median: m, ratio } = summarize(plan, c.name, field);
          return withRatio ? `${fmt(m)} (${fmt(ratio)}×)` : fmt(m);
        };
        switch (plan.workload) {
          case 'sequential':
          case 'concurrent':
            return [
              c.name,
              cell('opsPerSec', true),
              cell('cpuUsPerOp', true),
              cell('redisCpuUsPerOp', true),
              cell('commandsPerOp'),
            ];
          case 'idle':
            return [c.name, cell('commandsPerSec')];
          case 'memory':
            return [
              c.name,
              cell('heapGrowthPct'),
              cell('heapPerHeldLock'),
              cell('redisBytesPerKey'),
              cell('keysLeftPerKey'),
            ];
          case 'hot':
            return [
              c.name,
              cell('opsPerSec', true),
              cell('lostUpdates'),
              `${cell('handoffP50')} / ${cell('handoffP99')}`,
              `${cell('withinP50')} / ${cell('withinP99')} · ${cell('betweenP50')} / ${cell('betweenP99')} (${cell('betweenPct')} %)`,
              `${cell('waitP50')} / ${cell('waitP99')} / ${cell('waitMax')}`,
              `${cell('workerMin')} / ${cell('workerMax')}`,
              cell('commandsPerSection'),
              cell('failures'),
            ];
          case 'waiters':
            return [
              c.name,
              cell('parkedCommandsPerSec', true),
              cell('heapPerWaiter'),
              cell('drainMs', true),
              cell('inOrderPct'),
              cell('failures'),
            ];
          case 'keys':
            return [
              c.name,
              cell('heapPerLock'),
              cell('redisBytesPerLock'),
              cell('keysLeftPerLock'),
              cell('redisBytesLeftPerLock'),
            ];
        }
      });
    const header =
      plan.workload === 'hot'
        ? [
            'contender',
            'sections/s (ratio)',
            'lost updates',
            'handoff gap p50 / p99 ms',
            'gap p50 / p99 ms: within a process · between processes (share of handoffs)',
            'wait p50 / p99 / max ms',
            'sections per worker min / max',
            'commands per section',
            'acquire failures',
          ]
        : plan.workload === 'waiters'
          ? [
              'contender',
              'commands/s while parked (ratio)',
              'heap bytes per waiter',
              'release to last grant ms (ratio)',
              'granted in order %',
              'failed',
            ]
          : plan.workload === 'keys'
            ? [
                'contender',
                'heap bytes per held lock',
                'Redis bytes per held lock',
                'Redis keys left per lock',
                'Redis bytes left per lock',
              ]
            : plan.workload === 'idle'
              ? ['contender', 'commands/s']
              : plan.workload === 'memory'
                ? [
                    'contender',
                    'heap growth %',
                    'heap bytes per held lock',
                    'Redis bytes left per key',
                    'Redis keys left per key',
                  ]
                : [
                    'contender',
                    'pairs/s (ratio)',
                    'client CPU µs per pair (ratio)',
                    'Redis CPU µs per pair (ratio)',
                    'commands per pair',
                  ];
    const runsEach =
      Math.min(rounds, plan.rounds ?? rounds) * (values.smoke ? 1 : (plan.runsPerRound ?? 1));
    return `### ${plan.title} (${runsEach} run${runsEach > 1 ? 's' : ''} each; ${took(plan.id)})\n\n${markdownTable(header, rows)}\n`;
  });
  if (runHttp) sections.push(renderHttp());
  return `# Benchmark report

\`npm run bench\` on ${new Date().toISOString().slice(0, 10)}: ${rounds} rounds, contender order rotated each round, every run in
fresh processes against one private redis-server 7 on loopback; ${Math.round(seconds)} s in all. Each cell is the median over
the runs (the short uncontended workloads run several times per round); a ratio is the median of the ratios to the
**${BASELINE}**'s run of the same round and repetition (bare \`SET NX PX\`, 10 ms poll,
compare-and-delete \`EVALSHA\`, \`randomUUID\` tokens). Commands are counted on the client, subscriber connections included.
Redis CPU is the server's own CPU time (\`INFO cpu\`, user + system) during a run, per pair: what the lock costs Redis.
A handoff gap is the time from the end of one critical section to the start of the next, whichever worker runs it; it is
split by whether the next section ran in the same process as the last or in the other one.
The R sections run on three independent masters (ours with \`nodes\`, the Redlock libraries on the same three clients),
the C sections on a Cluster of three masters (every contender on an ioredis \`Cluster\` client, keys across slots), their
Redis CPU summed over the servers; each section's ratios are to the contender its title names.

${sections.join('\n')}`;
}
