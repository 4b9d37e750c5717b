import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import { Controller, Get, Module, type INestApplication } from '@nestjs/common';
import { Test } from '@nestjs/testing';
import { HealthCheck, HealthCheckService, TerminusModule } from '@nestjs/terminus';
import { LockService, RedisLockModule, type RedisLockModuleOptions } from '../../lib/index.js';
import { RedisLockHealthIndicator } from '../../lib/health/index.js';
import { eventually, sleep } from '../support/lock-module.js';
import { startRedis, type RedisServer } from '../support/redis-server.js';
import { assertWithin, watchStalls } from '../support/timing.js';

@Controller('health')
class HealthController {
  constructor(
    private readonly health: HealthCheckService,
    private readonly redisLock: RedisLockHealthIndicator,
  ) {}

  @Get()
  @HealthCheck()
  check() {
    return this.health.check([() => this.redisLock.isHealthy('locks')]);
  }
}

/** An app as a user builds it: Terminus in a health module that lists the indicator. */
async function startApp(options: RedisLockModuleOptions): Promise<[INestApplication, string]> {
  @Module({
    imports: [TerminusModule],
    controllers: [HealthController],
    providers: [RedisLockHealthIndicator],
  })
  class HealthModule {}
  const module = await Test.createTestingModule({
    imports: [RedisLockModule.forRoot({ ...options, isGlobal: true }), HealthModule],
  }).compile();
  const app = module.createNestApplication({ logger: false });
  await app.listen(0, '127.0.0.1');
  return [app, `${(await app.getUrl()).replace('[::1]', '127.0.0.1')}/health`];
}

interface Report {
  status: string;
  info?: Record<string, Record<string, unknown>>;
  error?: Record<string, Record<string, unknown>>;
}

async function get(url: string): Promise<[number, Report, number]> {
  const started = performance.now();
  const response = await fetch(url);
  return [response.status, (await response.json()) as Report, performance.now() - started];
}

describe('RedisLockHealthIndicator (nestjs-redis-lock/health)', () => {
  let servers: RedisServer[];

  before(async () => {
    servers = await Promise.all([0, 1, 2, 3, 4].map(() => startRedis()));
  });
  after(async () => {
    for (const server of servers ?? []) server.signal('SIGCONT');
    await Promise.all((servers ?? []).map((server) => server.stop()));
  });

  it('reports up with the latency, and down within commandTimeout when Redis is paused or gone', async () => {
    const server = servers[0];
    const [app, url] = await startApp({ connection: server.url, commandTimeout: 500 });
    try {
      const [status, report] = await get(url);
      assert.equal(status, 200);
      assert.equal(report.info?.locks.status, 'up');
      assert.equal(typeof report.info?.locks.latencyMs, 'number');

      const watch = watchStalls();
      server.signal('SIGSTOP');
      const [paused, pausedReport, took] = await get(url);
      server.signal('SIGCONT');
      assert.equal(paused, 503);
      assert.equal(pausedReport.error?.locks.status, 'down');
      assert.match(String(pausedReport.error?.locks.error), /no reply within commandTimeout/);
      assert.ok(took >= 450, `answered after ${took.toFixed(0)} ms`);
      assertWithin(took, 500, watch, 'the report with Redis paused');

      await server.kill();
      const [gone, , tookGone] = await get(url);
      assert.equal(gone, 503);
      assertWithin(tookGone, 500, watch, 'the report with Redis gone');
      // It says which Redis and why, not a silence: the port refuses connections.
      const reports: string[] = [];
      for (let i = 0; i < 3; i++) {
        reports.push(String((await get(url))[1].error?.locks.error));
        await sleep(150);
      }
      assert.deepEqual(
        reports.filter((report) => !/Redis at 127\.0\.0\.1:\d+ is unreachable/.test(report)),
        [],
        'every report while the port refuses connections names the Redis and says it is unreachable',
      );
      let said = '';
      const refused = new RegExp(
        `Redis at 127\\.0\\.0\\.1:${server.port} is unreachable \\(connect ECONNREFUSED`,
      );
      assert.ok(
        await eventually(async () => {
          said = String((await get(url))[1].error?.locks.error);
          return refused.test(said);
        }, 3_000),
        said,
      );
      watch.stop();
      servers[0] = await server.restart();
      assert.ok(
        await eventually(async () => (await get(url))[0] === 200),
        'up again once Redis is back',
      );
    } finally {
      await app.close();
    }
  });

  it('Redlock: up while a majority of nodes answers, with each node in the details', async () => {
    const [app, url] = await startApp({ nodes: servers.map((server) => server.url) });
    try {
      const [status, report] = await get(url);
      assert.equal(status, 200);
      assert.deepEqual(
        { quorum: report.info?.locks.quorum, answering: report.info?.locks.answering },
        { quorum: 3, answering: 5 },
      );
      servers[3].signal('SIGSTOP');
      servers[4].signal('SIGSTOP');
      const [minority, minorityReport] = await get(url);
      assert.equal(minority, 200);
      const nodes = minorityReport.info?.locks.nodes as { status: string }[];
      assert.deepEqual(
        nodes.map((node) => node.status),
        ['up', 'up', 'up', 'down', 'down'],
      );
      const watch = watchStalls();
      servers[2].signal('SIGSTOP');
      const [majority, majorityReport, took] = await get(url);
      assert.equal(majority, 503);
      assert.equal(majorityReport.error?.locks.answering, 2);
      assertWithin(took, 1_000, watch, 'the report with a majority paused'); // commandTimeout
      watch.stop();
    } finally {
      for (const server of servers) server.signal('SIGCONT');
      await app.close();
    }
  });

  it('lists the leaderships campaigning now: key, id and whether each leads, follows or fails to reach Redis', async () => {
    const [app, url] = await startApp({
      connection: servers[1].url,
      commandTimeout: 300,
      defaults: { retryInterval: 100 },
    });
    const locks = app.get(LockService);
    const untilAborted = async ({ signal }: { signal: AbortSignal }): Promise<void> => {
      await new Promise((resolve) => signal.addEventListener('abort', resolve, { once: true }));
    };
    try {
      const leader = locks.lead('leader:report', untilAborted, { ttl: 1_000 });
      await leader.elected();
      const follower = locks.lead('leader:report', untilAborted, { ttl: 1_000, id: 'second' });
      const leaderships = async (): Promise<unknown> =>
        (await get(url))[1].info?.locks?.leaderships;
      assert.deepEqual(await leaderships(), [
        { key: 'leader:report', id: leader.id, state: 'leading' },
        { key: 'leader:report', id: 'second', state: 'following' },
      ]);
      // Redis gone: the leader's lock cannot be confirmed, and both campaigns' attempts fail.
      await servers[1].kill();
      const failing = async (): Promise<unknown> => (await get(url))[1].error?.locks?.leaderships;
      assert.ok(
        await eventually(
          async () =>
            JSON.stringify(await failing()) ===
            JSON.stringify([
              { key: 'leader:report', id: leader.id, state: 'failing' },
              { key: 'leader:report', id: 'second', state: 'failing' },
            ]),
          5_000,
        ),
        JSON.stringify(await failing()),
      );
      servers[1] = await servers[1].restart();
      assert.ok(
        await eventually(async () => {
          const states = ((await leaderships()) as { state: string }[] | undefined)?.map(
            ({ state }) => state,
          );
          return states?.sort().join() === 'following,leading';
        }, 5_000),
        'one leads and one follows once Redis is back',
      );
      await follower.stop();
      await leader.stop();
      assert.equal(await leaderships(), undefined, 'no leadership: nothing listed');
    } finally {
      await app.close();
    }
  });
});
