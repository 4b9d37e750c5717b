#!/usr/bin/env node
// Runs the compiled test files (build/test/**/*.spec.js), each in a `node --test` process of its
// own, in two tiers:
//
// 1. shared: unit tests and suites against one redis-server, `--concurrency` files at a time
//    (5 by default: on 2 cores, they mostly wait on timers and Redis: at 3 the machine was
//    busy ~40 % of the tier's 132 s, at 5 ~75 % of its 90 s). A failure here is a failure: no
//    re-run.
// 2. isolated: the suites that start more than one server or more than one process (a Cluster,
//    Sentinels, Redlock's masters, worker processes, the chaos short profile), after the shared
//    tier, in three lanes: the busy files (ISOLATED) one at a time, and beside them, one at a time
//    in each of two lanes, the files that mostly wait on Redis and timers (BESIDE: under half a
//    core each, measured with `/usr/bin/time`), so that no two busy suites ever load the machine
//    together (the first lane ends with waiting files too, to even the lanes out). A file of
//    this tier that fails is run once more when both lanes are done,
//    alone on the idle machine: if it passes then, the run passes and ends with a
//    `FLAKY: <file> — <failure>` line; if it fails again, the run fails. Never a file whose failure
//    is an invariant of the lock (INVARIANT: two holders, a fence going back, a stale write
//    accepted, a lock left behind or never told lost, a call that never settled, a model-based
//    property, a bound missed by more than the measured slack): that fails the run at once,
//    however rarely it strikes.
//
// A file that runs longer than `--file-timeout` seconds is stopped (its whole process group:
// the redis-servers and workers it started go with it) and counts as failed.
//
// Options: --compat (only the suites whose behaviour depends on the NestJS or ioredis major, see
// COMPAT), --only <substring> (repeatable), --concurrency <n>, --no-retry, --json <path> (a summary
// for scripts/test-repeat.mjs), --file-timeout <s> (default 420).
import { spawn } from 'node:child_process';
import { mkdtempSync, readdirSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, relative } from 'node:path';
import { hasRedisServer, redisMissing } from './redis-missing.mjs';
import { parseArgs } from 'node:util';

const root = join(import.meta.dirname, '..');
const testDir = join(root, 'build', 'test');

/**
 * Suites that start more than one server (a Cluster, Sentinels, several masters, a replica) or
 * more than one process (workers, the sample app, npm): the isolated tier. Paths under build/test.
 */
/**
 * Failure messages that report a broken invariant of the lock, never a slow machine: such a
 * failure is not re-run. (A bound exceeded is reported by `assertWithin` against a slack measured
 * on the machine; a set-up failure, such as a server that did not start, is neither.)
 */
const INVARIANT = [
  /Property failed|kept sequence/, // the model-based suite: every check there is an invariant
  /overlap/i,
  /two (live )?holders/i,
  /fence (regression|went back|changed)|a fence went back/i,
  /stale (write|fence)s? accepted|stale write/i,
  /left behind|leftover lock|lock left|keys? left|without TTL/i,
  /unhandled rejection|unsettled/i,
  /never (told|signalled|fired|settled)/i,
  /held in Redis by/i,
  /lost holders/i,
  /oversold|lost updates? under the lock/i,
  // A bound of the lock's (a reply deadline, a shutdown) missed by more than the machine added,
  // measured while the test ran (test/support/timing.ts), or a deadline cut short.
  /by more than the measured slack|a deadline cut short/,
];
const isInvariant = (failure) => INVARIANT.some((pattern) => pattern.test(failure));

/**
 * The isolated tier's first lane: the busy suites (over half a core each, measured with
 * `/usr/bin/time`: worker processes, the chaos short profile, builds), one at a time, then
 * waiting ones that fill the lane to the others' length (seconds in a run on 2 cores).
 */
const ISOLATED = [
  'chaos/chaos.spec.js', // 57
  'integration/processes.spec.js', // 34
  'package/pack.spec.js', // 17 alone, 40 beside the other lanes
  'e2e/sample-command.e2e.spec.js', // 18
  'integration/cluster-failover.spec.js', // 12
  'faults/hostile-input.spec.js', // 7
  'demo/demo.spec.js', // 2
];

/**
 * Isolated suites that mostly wait (failovers, timeouts, paused servers, workers that sleep in
 * their sections): each uses under half a core on its own (`redlock.spec` 20 s of CPU in 46). They
 * run one at a time in each of the lanes beside the first, so that the machine's two cores carry
 * one busy suite and the waiting ones. Each lane's longest first; the first three ~160 s each.
 */
const BESIDE = [
  [
    // Builds dist/ as pack.spec does, so never beside it: first, long before pack.spec's turn.
    // The snippets compile against its .d.ts.
    'package/snippets.spec.js', // 21
    // Failovers on a Cluster and through Sentinel: mostly waiting for them.
    'chaos/chaos-failover.spec.js', // 70
    'integration/jobs.spec.js', // 30
    'integration/model-redlock.spec.js', // 28
    'integration/health.spec.js', // 11
    'integration/replica-ack.spec.js', // 5
  ],
  [
    'integration/redlock.spec.js', // 48
    'integration/model-cluster.spec.js', // 40
    'integration/cluster.spec.js', // 33
    'faults/bounded-operations.spec.js', // 27
    'integration/sentinel.spec.js', // 15
  ],
  // A follower's minute-long wait for the lock, waited out: idle for 65 s, so a lane of its own.
  ['integration/leadership-wait.spec.js'], // 65
];

/**
 * The shared tier's files that take 10 s or more, longest first (seconds in a run on 2 cores,
 * five at a time): the pool starts with them, so that none of them begins last and runs on alone
 * (the model-based suite's file is small, its suite elsewhere: by size it began last and added
 * ~30 s).
 */
const SHARED_FIRST = [
  'integration/waiting.spec.js', // 58
  'integration/holders.spec.js', // 32
  'integration/lease.spec.js', // 29
  'e2e/sample.fastify.e2e.spec.js', // 21
  'integration/multi-key.spec.js', // 20
  // Sixth, so that it begins once the checks beside the tests (ESLint, tsc) are about done: its
  // random sequences once ran past the file's timeout in a run where it began beside them (cause
  // not found: its seed and where it hung are printed since).
  'integration/model.spec.js', // 44
  'integration/model-memory.spec.js', // 20
  'e2e/sample.express.e2e.spec.js', // 18
  'integration/leadership.spec.js', // 18
  'integration/fair.spec.js', // 17
  'integration/in-memory-differential.spec.js', // 16
  'integration/with-lock.spec.js', // 16
  'integration/read-write.spec.js', // 13
  'integration/lock-service.spec.js', // 11
];

/**
 * Files not in `npm test`: run on their own (`--only`). The bench smoke run (two lanes of worker
 * processes, a core each, for a minute): `npm run bench:smoke`, whenever the bench or a
 * contender changes.
 */
const OWN_SCRIPT = ['bench/bench.spec.js'];

/**
 * What the NestJS 11 / ioredis 5 run covers: what differs between those versions. The module and
 * its options, the decorator on every transport, and the suites that drive ioredis on every kind
 * of client: standalone, Cluster and Sentinel (Redlock mode drives one standalone client per node,
 * as the standalone suites do). Not the chaos short profile, the bench smoke run or the sample
 * app end to end (its routes are the decorator's, which with-lock.spec covers on Nest 11; the
 * consumer app of test:consumers serves a locked route on Nest 11 as a user's app would): CI time.
 */
const COMPAT = [
  'integration/cluster.spec.js',
  'integration/lock-service.spec.js',
  'integration/module.spec.js',
  'integration/nest-providers.spec.js',
  'integration/sentinel.spec.js',
  'integration/with-lock.spec.js',
  'integration/with-lock-streams.spec.js',
  'integration/on-busy.spec.js',
  'integration/leadership.spec.js',
];

const { values } = parseArgs({
  options: {
    compat: { type: 'boolean', default: false },
    only: { type: 'string', multiple: true },
    concurrency: { type: 'string', default: '5' },
    'no-retry': { type: 'boolean', default: false },
    json: { type: 'string' },
    'file-timeout': { type: 'string', default: '420' },
  },
});
if (!hasRedisServer()) {
  console.error(redisMissing('npm test'));
  process.exit(1);
}
const concurrency = Number(values.concurrency);
const fileTimeoutMs = Number(values['file-timeout']) * 1_000;

const all = findSpecs(testDir)
  .map((path) => relative(testDir, path))
  .filter((file) => !values.compat || COMPAT.includes(file))
  .filter((file) => !values.only || values.only.some((part) => file.includes(part)))
  .filter((file) => !OWN_SCRIPT.includes(file) || values.only);
for (const file of [...ISOLATED, ...BESIDE.flat(), ...OWN_SCRIPT, ...COMPAT, ...SHARED_FIRST]) {
  if (!findSpecs(testDir).some((path) => relative(testDir, path) === file)) {
    throw new Error(`scripts/test-run.mjs names ${file}, which is not in build/test`);
  }
}
// Longest first, and a pool finishes sooner when it starts with them: SHARED_FIRST in its order,
// then the biggest files.
const weight = (file) =>
  statSync(join(testDir, file)).size +
  (SHARED_FIRST.includes(file) ? 1e9 * (SHARED_FIRST.length - SHARED_FIRST.indexOf(file)) : 0);
const shared = all
  .filter((file) => ![...ISOLATED, ...BESIDE.flat(), ...OWN_SCRIPT].includes(file))
  .sort((a, b) => weight(b) - weight(a));
// In the lists' order: the longest first in each lane. With --compat, a lane for each isolated
// suite: COMPAT holds only suites that mostly wait.
const laneLists = values.compat
  ? [...ISOLATED, ...BESIDE.flat()].map((file) => [file])
  : [ISOLATED, ...BESIDE, OWN_SCRIPT];
const lanes = laneLists.map((lane) => lane.filter((file) => all.includes(file)));

const seconds = (ms) => (ms / 1_000).toFixed(1);
const scratch = mkdtempSync(join(tmpdir(), 'test-run-'));
// The files' process groups do not get a terminal's Ctrl-C: stopped with the runner, they go too.
const running = new Set();
for (const signal of ['SIGINT', 'SIGTERM']) {
  process.once(signal, () => {
    for (const pid of running) killGroup(pid);
    rmSync(scratch, { recursive: true, force: true });
    process.exit(1);
  });
}
const results = [];
const started = performance.now();

const runShared = () =>
  pool(shared, concurrency, async (file) => {
    results.push({ file, tier: 'shared', attempts: [await runFile(file)] });
  });
const timed = async (run) => {
  const begun = performance.now();
  await run();
  return performance.now() - begun;
};
const runIsolated = () =>
  Promise.all(
    lanes.map(async (lane) => {
      for (const file of lane)
        results.push({ file, tier: 'isolated', attempts: [await runFile(file)] });
    }),
  );
// With --compat, every file mostly waits (COMPAT holds no busy suite): the isolated ones run
// beside the shared tier (~20 s less), each in its own lane.
const [sharedMs, isolatedMs] = values.compat
  ? await Promise.all([timed(runShared), timed(runIsolated)])
  : [await timed(runShared), await timed(runIsolated)];
for (const { file, tier, attempts } of results) {
  if (tier === 'shared' || attempts[0].ok || values['no-retry']) continue;
  const broken = attempts[0].failures.find(isInvariant);
  if (broken) {
    console.log(`\n✖ ${file} broke an invariant: no re-run (${broken})\n`);
    continue;
  }
  console.log(`\n↻ ${file} failed; running it once more, alone\n`);
  attempts.push(await runFile(file));
}
rmSync(scratch, { recursive: true, force: true });

console.log('\nfile                                        tier      seconds  result');
for (const { file, tier, attempts } of results) {
  const outcome = attempts.at(-1).ok ? (attempts.length > 1 ? 'flaky' : 'ok') : 'FAILED';
  const time = attempts.map(({ ms }) => seconds(ms)).join(' + ');
  console.log(`${file.padEnd(44)}${tier.padEnd(10)}${time.padStart(7)}  ${outcome}`);
}
const total = performance.now() - started;
console.log(
  `\n${results.length} files in ${seconds(total)} s (shared tier ${seconds(sharedMs)} s, isolated ${seconds(isolatedMs)} s${values.compat ? ', side by side' : ''})`,
);
const failed = results.filter(({ attempts }) => !attempts.at(-1).ok);
const flaky = results.filter(({ attempts }) => attempts.length > 1 && attempts.at(-1).ok);
for (const { file, attempts } of flaky) {
  console.log(`FLAKY: ${file} — ${attempts[0].failures[0] ?? 'failed'}`);
}
for (const { file, attempts } of failed) {
  console.log(`FAILED: ${file} — ${attempts.at(-1).failures[0] ?? 'failed'}`);
}
if (values.json) writeFileSync(values.json, JSON.stringify({ ms: total, results }, null, 2));
process.exitCode = failed.length > 0 ? 1 : 0;

/** Runs `file` in a `node --test` process of its own; prints its output when it is done. */
function runFile(file) {
  const failuresPath = join(scratch, `${file.replaceAll('/', '_')}.${performance.now()}.jsonl`);
  const args = [
    '--test',
    // node's own limit, per test and for the file as a whole, says which test hung; the group
    // kill below (after --file-timeout) is the backstop.
    `--test-timeout=${fileTimeoutMs - 20_000}`,
    '--test-reporter=spec',
    '--test-reporter-destination=stdout',
    `--test-reporter=${join(root, 'scripts', 'test-failures.reporter.mjs')}`,
    `--test-reporter-destination=${failuresPath}`,
    '--import',
    './build/test/support/setup.js',
    join('build', 'test', file),
  ];
  const begun = performance.now();
  return new Promise((resolve) => {
    // Its own process group, so that a file that hangs can be stopped with everything it started.
    const child = spawn(process.execPath, args, {
      cwd: root,
      detached: true,
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    running.add(child.pid);
    let output = '';
    child.stdout.on('data', (chunk) => (output += chunk));
    child.stderr.on('data', (chunk) => (output += chunk));
    let timedOut = false;
    const timer = setTimeout(() => {
      timedOut = true;
      killGroup(child.pid);
    }, fileTimeoutMs);
    child.once('close', (code, signal) => {
      clearTimeout(timer);
      killGroup(child.pid); // anything it left behind (it should leave nothing)
      running.delete(child.pid);
      const ms = performance.now() - begun;
      const failures = readFailures(failuresPath);
      if (timedOut) failures.unshift(`still running after ${seconds(fileTimeoutMs)} s: stopped`);
      const ok = code === 0 && !timedOut;
      if (!ok && failures.length === 0) failures.push(`exited with ${signal ?? `code ${code}`}`);
      console.log(`\n${ok ? '✔' : '✖'} ${file} (${seconds(ms)} s)\n${output.trimEnd()}`);
      resolve({ ok, ms, failures });
    });
  });
}

function readFailures(path) {
  try {
    return readFileSync(path, 'utf8')
      .split('\n')
      .filter(Boolean)
      .map((line) => {
        const { name, message } = JSON.parse(line);
        return `${name}: ${message}`;
      });
  } catch {
    return [];
  }
}

function killGroup(pid) {
  try {
    process.kill(-pid, 'SIGKILL');
  } catch {
    // Already gone.
  }
}

async function pool(items, size, work) {
  const queue = [...items];
  await Promise.all(
    Array.from({ length: Math.min(size, queue.length) }, async () => {
      while (queue.length > 0) await work(queue.shift());
    }),
  );
}

function findSpecs(dir) {
  return readdirSync(dir, { withFileTypes: true }).flatMap((entry) => {
    const path = join(dir, entry.name);
    if (entry.isDirectory()) return findSpecs(path);
    return entry.name.endsWith('.spec.js') ? [path] : [];
  });
}
