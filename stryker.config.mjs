// Mutation testing (`npm run test:mutation`, see scripts/mutation.mjs): one Stryker run per group
// of safety-critical files, each mutant run against the compiled specs that cover those files,
// with the gate's setup (unhandled rejections and leaked handles fail a test). STRYKER_GROUP picks
// the group. The Lua scripts are template strings, which Stryker does not mutate as Lua: their
// owner checks and fences are guarded by the mutant tests named in the README instead.

/** Group name → the files mutated and the specs that must kill their mutants. */
export const GROUPS = {
  quorum: {
    mutate: ['lib/redis/quorum.ts'],
    tests: ['build/test/integration/redlock.spec.js'],
  },
  lease: {
    mutate: ['lib/engine/lock.lease.ts'],
    tests: [
      'build/test/integration/lease.spec.js',
      'build/test/integration/lock-service.spec.js',
      // The lease's events, and the token write of a lock passed on in the process.
      'build/test/integration/events.spec.js',
      'build/test/integration/holders.spec.js',
    ],
  },
  'multi-key': {
    mutate: ['lib/engine/multi-key.acquisition.ts'],
    tests: [
      'build/test/integration/multi-key.spec.js',
      'build/test/integration/hold-at-least.spec.js',
    ],
  },
  redlock: {
    mutate: ['lib/redis/redlock.backend.ts'],
    tests: [
      'build/test/unit/redlock-undo.spec.js',
      'build/test/integration/redlock.spec.js',
      // Up while a majority answers, each node in the details.
      'build/test/integration/health.spec.js',
      // Each node's Redis user checked at startup.
      'build/test/integration/acl.spec.js',
    ],
  },
  // The same file against the model-based suite on Redlock alone (own tokens, restarts, lost
  // scripts, late grants, generated): a group of its own, as together each mutant would run both
  // (~4 h). A mutant survives Redlock mode's tests only if it survives both groups.
  'redlock-model': {
    mutate: ['lib/redis/redlock.backend.ts'],
    tests: ['build/test/integration/model-redlock.spec.js'],
  },
  // The engine's one path for acquiring (attempts, waits, re-entry, the end of a wait) and its
  // replies (bounds, failure mapping, late-grant undos). Fast specs first: a mutant stops at the
  // first that fails.
  engine: {
    mutate: ['lib/engine/acquire-loop.ts', 'lib/engine/replies.ts'],
    tests: [
      // How a failure is mapped (a reply cut off by the module's own closing, a replica's refusal
      // shown the module's way): pure logic, in a few milliseconds.
      'build/test/unit/error-messages.spec.js',
      'build/test/integration/events.spec.js',
      'build/test/integration/reentrancy.spec.js',
      // (A lock that came too late is not busy: what a skipping call tells from a busy key.)
      'build/test/integration/on-busy.spec.js',
      'build/test/integration/lock-service.spec.js',
      'build/test/faults/bounded-operations.spec.js',
      'build/test/integration/waiting.spec.js',
      // Who queues first in its process (not a fair caller, nor a semaphore's), and a writer's
      // mark on read locks, renewed by each attempt and taken back by a refused writer.
      'build/test/integration/fair.spec.js',
      'build/test/integration/semaphore.spec.js',
      'build/test/integration/read-write.spec.js',
      // A key of several: its late grant's token, and the events of a part (the call reports).
      'build/test/integration/multi-key.spec.js',
      // Redlock's refusal of shapes, and whether a round a silent node left undecided timed out.
      'build/test/integration/redlock.spec.js',
    ],
  },
  handoff: {
    mutate: ['lib/redis/handoff.ts'],
    tests: ['build/test/integration/waiting.spec.js'],
  },
  reentry: {
    mutate: ['lib/engine/lock.reentry.ts'],
    tests: ['build/test/integration/reentrancy.spec.js'],
  },
  leadership: {
    mutate: ['lib/lock.leadership.ts'],
    // Shutdown's sweep of every leadership (`stopAll`) is the Nest layer's: nest-providers.
    tests: [
      'build/test/integration/leadership.spec.js',
      'build/test/integration/nest-providers.spec.js',
      // A follower's minute-long wait ending (65 s): last, so that most mutants stop before it.
      'build/test/integration/leadership-wait.spec.js',
    ],
  },
  // The decorator's skip path (`onBusy: 'skip'`): which failures a call or a subscription skips
  // and which pass on, and a scheduled job's outage log.
  decorator: {
    mutate: [
      'lib/decorators/with-lock.decorator.ts:257-268',
      'lib/decorators/with-lock.decorator.ts:296-300',
      'lib/decorators/with-lock.decorator.ts:571-612',
      'lib/decorators/with-lock.decorator.ts:651-652',
    ],
    // (with-lock.spec: every method that does not skip waits.)
    tests: [
      'build/test/integration/on-busy.spec.js',
      'build/test/integration/with-lock.spec.js',
      'build/test/integration/jobs.spec.js',
    ],
  },
  // RedisLockTestingModule's store: the side-by-side test against the Redis scripts, and the
  // module's own spec (the model suite on it takes 15 s a mutant: `--` it in for a deep run).
  testing: {
    mutate: ['lib/testing/in-memory-lock.store.ts', 'lib/testing/in-memory-lock.backend.ts'],
    tests: [
      'build/test/integration/in-memory-differential.spec.js',
      'build/test/integration/testing-module.spec.js',
    ],
  },
};

const name = process.env.STRYKER_GROUP ?? 'quorum';
const group = GROUPS[name];
if (!group)
  throw new Error(`STRYKER_GROUP: no group "${name}" (${Object.keys(GROUPS).join(', ')})`);

export default {
  testRunner: 'tap',
  plugins: ['@stryker-mutator/tap-runner', './scripts/stryker-progress-reporter.mjs'],
  mutate: group.mutate,
  // Mutant schemata are compiled once, type checks off in the mutated files.
  buildCommand: 'tsc -p tsconfig.json',
  tap: {
    testFiles: group.tests,
    nodeArgs: ['--require', '{{hookFile}}', '--import', './build/test/support/setup.js'],
    forceBail: true,
  },
  coverageAnalysis: 'perTest',
  // Messages and log lines are not safety lines.
  mutator: { excludedMutations: ['StringLiteral'] },
  ignoreStatic: true,
  // Two cores: one mutant at a time keeps the specs' own timing bounds honest.
  concurrency: 1,
  timeoutMS: 120_000,
  reporters: ['clear-text', 'progress', 'json', 'progress-jsonl'],
  jsonReporter: { fileName: `.stryker-reports/${name}.json` },
  tempDirName: '.stryker-tmp',
  cleanTempDir: true,
};
