/**
 * The layers of lib/, checked on every `npm run lint` (dependency-cruiser):
 *   Nest layer   lib/*.module*, lib/lock.service.ts, lib/lock.leadership.ts, lib/decorators/,
 *                lib/health/, lib/index.ts: the API, its lifecycle and Nest's discovery
 *   engine       lib/engine/: the acquire loop, leases, re-entry, several keys, events
 *   Redis        lib/redis/: connections, key layout, scripts, handoff, fair queue, pub/sub
 *   shared       lib/errors/, lib/interfaces/, lib/utils/, lib/options/
 *   testing      lib/testing/: the module without Redis (its own entry point, on top of the others)
 * Dependencies point down only: no cycle, nothing below imports what is above it, the Nest layer
 * reaches Redis only through the engine, and the library never imports the tests or the sample.
 */
const NEST =
  '^lib/(index\\.ts|redis-lock\\.module[^/]*|lock\\.(service|leadership)\\.ts|decorators/|health/)';
const ENGINE = '^lib/engine/';
const SHARED = '^lib/(errors|interfaces|utils|options)/';

module.exports = {
  forbidden: [
    {
      name: 'no-cycle',
      severity: 'error',
      comment: 'An import cycle: split the shared part into a file both can import.',
      from: { path: '^lib/' },
      to: { circular: true },
    },
    {
      name: 'nothing-to-testing',
      severity: 'error',
      comment:
        'lib/testing/ (RedisLockTestingModule) is an entry point of its own on top of the library: nothing else in lib/ imports it.',
      from: { path: '^lib/', pathNot: '^lib/testing/' },
      to: { path: '^lib/testing/' },
    },
    {
      name: 'lib-not-to-tests-or-sample',
      severity: 'error',
      comment: 'The library ships alone: it never imports the tests, the sample or the scripts.',
      from: { path: '^lib/' },
      to: { path: '^(test|sample|scripts)/' },
    },
    {
      name: 'engine-not-to-nest-layer',
      severity: 'error',
      comment:
        'The engine (acquire loop, lease, re-entry, events) is below the Nest layer: it never imports it or the decorators.',
      from: { path: ENGINE },
      to: { path: NEST },
    },
    {
      name: 'nest-layer-not-to-redis',
      severity: 'error',
      comment:
        'The Nest layer reaches Redis through the engine (LockEngine), never lib/redis/ itself.',
      from: { path: NEST },
      to: { path: '^lib/redis/' },
    },
    {
      name: 'redis-not-up',
      severity: 'error',
      comment:
        'lib/redis/ is below the engine and the Nest layer: it imports only itself and the shared files.',
      from: { path: '^lib/redis/' },
      to: { path: '^lib/', pathNot: ['^lib/redis/', SHARED] },
    },
    {
      name: 'shared-not-up',
      severity: 'error',
      comment:
        'Errors, interfaces, utilities and option checks are the bottom layer: they import only each other.',
      from: { path: SHARED },
      to: { path: '^lib/', pathNot: SHARED },
    },
  ],
  options: {
    doNotFollow: { path: 'node_modules' },
    tsPreCompilationDeps: true,
    tsConfig: { fileName: 'tsconfig.json' },
  },
};
