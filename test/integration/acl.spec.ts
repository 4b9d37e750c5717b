/**
 * A least-privilege Redis user (issue 43, item 5): the README's ACL recipe runs every lock shape
 * with nothing more, and a user that may use the keys but not the channels still releases (the
 * release deleted the key: it is reported released), with one warning, while waiters poll.
 */
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import { Cluster, Redis } from 'ioredis';
import { Test } from '@nestjs/testing';
import {
  LockService,
  RedisLockConfigurationError,
  RedisLockModule,
  type RedisLockModuleOptions,
} from '../../lib/index.js';
import {
  eventually,
  LogCapture,
  startLockModule,
  uniqueKey,
  waitingCallers,
} from '../support/lock-module.js';
import { startCluster, startRedis, type RedisServer } from '../support/redis-server.js';

/** The README's recipe ("Least-privilege Redis user"): keys and channels of the keyPrefix. */
const RECIPE = [
  'resetkeys',
  '~lock:*',
  'resetchannels',
  '&lock:*',
  '-@all',
  // What the module sends itself.
  '+evalsha',
  '+eval',
  '+exists',
  '+info',
  '+ping',
  '+subscribe',
  '+unsubscribe',
  // What its scripts run.
  '+get',
  '+set',
  '+del',
  '+pexpire',
  '+pttl',
  '+type',
  '+time',
  '+publish',
  '+zadd',
  '+zrem',
  '+zrange',
  '+zscore',
  '+zcard',
  '+zrangebyscore',
  '+zremrangebyscore',
  '+hset',
  '+hget',
  '+hdel',
  '+hgetall',
];

/** Every shape, taken, waited for by another process, released. */
async function everyShape(a: LockService, b: LockService): Promise<void> {
  const options = [{}, { limit: 2 }, { mode: 'read' as const }, { fair: true }];
  for (const option of options) {
    const key = uniqueKey();
    const first = await a.acquire(key, { ...option, ttl: 5_000 });
    // A second holder where the shape allows one, else a waiter in the other process.
    const exclusive = !('limit' in option) && !('mode' in option);
    const waiting = exclusive
      ? b.acquire(key, { fair: 'fair' in option, acquireTimeout: 5_000 })
      : b.acquire(key, { ...option, acquireTimeout: 5_000 });
    if (exclusive) {
      assert.ok(await eventually(() => waitingCallers(b, key) === 1), 'the other process waits');
    }
    assert.equal(await first.release(), true, JSON.stringify(option));
    const second = await waiting;
    assert.equal(await second.release(), true, JSON.stringify(option));
    assert.equal(await a.isLocked(key), false);
  }
  const keys = [uniqueKey(), uniqueKey()];
  assert.equal(await a.using(keys, () => 'both'), 'both');
  const fence = await new Promise<number>((resolve) => {
    a.lead(uniqueKey(), async (term) => resolve(term.fence));
  });
  assert.ok(fence > 0);
}

/**
 * Two apps on `options` (two processes of one service; a function gives each its own, such as a
 * Cluster client of its own), every shape between them, and the
 * log lines of the run. `poll`: their waiters retry every 200 ms; else never within the test
 * (60 s), so that a waiter that gets the key was woken by the release.
 */
async function twoApps(
  options:
    Omit<RedisLockModuleOptions, 'defaults'> | (() => Omit<RedisLockModuleOptions, 'defaults'>),
  poll: boolean,
  more: (a: LockService) => Promise<void> = async () => undefined,
): Promise<{ level: string; message: string }[]> {
  const defaults = { retryInterval: poll ? 200 : 60_000 };
  const optionsOf = typeof options === 'function' ? options : () => options;
  const a = await startLockModule({ ...optionsOf(), defaults });
  const b = await startLockModule({ ...optionsOf(), defaults });
  const logs = LogCapture.install();
  try {
    await everyShape(a.locks, b.locks);
    await more(a.locks);
    return logs.capture.lines;
  } finally {
    logs.restore();
    await a.close();
    await b.close();
  }
}

describe('a least-privilege Redis user', () => {
  let server: RedisServer;
  let admin: Redis;

  before(async () => {
    server = await startRedis();
    admin = new Redis(server.url);
    await admin.acl('SETUSER', 'locks', 'on', '>pw', ...RECIPE);
    // Keys and commands, but no channel (Redis 7's default for a new user: resetchannels).
    await admin.acl('SETUSER', 'nochannels', 'on', '>pw', '~lock:*', 'resetchannels', '+@all');
  });
  after(async () => {
    admin?.disconnect();
    await server?.stop();
  });

  const connection = (username: string) => ({
    host: '127.0.0.1',
    port: server.port,
    username,
    password: 'pw',
  });

  it("the README's recipe runs every shape, waiters woken by the release, and logs no warning", async () => {
    const lines = await twoApps({ connection: connection('locks') }, false);
    assert.deepEqual(
      lines.filter((line) => line.level === 'warn'),
      [],
    );
  });

  it("with an ioredis keyPrefix on the client, the recipe's patterns behind it suffice: channels carry it as keys do", async () => {
    const recipe = RECIPE.map((rule) => rule.replace(/^([~&])lock:/, '$1svc:lock:'));
    await admin.acl('SETUSER', 'prefixed', 'on', '>pw', ...recipe);
    const lines = await twoApps(
      { connection: { ...connection('prefixed'), keyPrefix: 'svc:' } },
      false,
    );
    assert.deepEqual(
      lines.filter((line) => line.level === 'warn'),
      [],
    );
  });

  it('a user without the channels: a release that deleted the key is reported released, with one warning; waiters poll', async () => {
    const logged = await twoApps({ connection: connection('nochannels') }, true, async (a) => {
      assert.equal(await a.using(uniqueKey(), () => 'done'), 'done');
    });
    const lines = logged.map((line) => line.message);
    // Once per LockService (both released).
    assert.equal(
      lines.filter((line) => line.startsWith('Redis refused to announce a lock release')).length,
      2,
      lines.join('\n'),
    );
    assert.ok(!lines.some((line) => /could not release/.test(line)), lines.join('\n'));
  });

  describe('the check of the user at startup', () => {
    /** Boots a module as the user `username`; its log lines from init on. */
    async function boot(username: string) {
      const module = await Test.createTestingModule({
        imports: [RedisLockModule.forRoot({ connection: connection(username) })],
      }).compile();
      const logs = LogCapture.install();
      try {
        const error = await module.init().then(
          () => undefined,
          (e: unknown) => e,
        );
        return { error, lines: logs.capture.lines.map((line) => line.message) };
      } finally {
        logs.restore();
        await module.close();
      }
    }

    it('a user missing a command the scripts run, or the keys, fails the boot naming what Redis refused', async () => {
      const without = (rule: string) => RECIPE.filter((each) => each !== rule);
      await admin.acl('SETUSER', 'nozadd', 'on', '>pw', ...without('+zadd'));
      await admin.acl('SETUSER', 'nohget', 'on', '>pw', ...without('+hget'));
      await admin.acl(
        'SETUSER',
        'otherkeys',
        'on',
        '>pw',
        ...RECIPE.map((r) => r.replace('~lock:*', '~other:*')),
      );
      await admin.acl('SETUSER', 'noevalsha', 'on', '>pw', ...without('+evalsha'));
      // Every lock key (`lock:{<key>}…`), but not the fence counter every lock writes
      // (`lock:{}:counter`): found by a review, where such a user booted and every lock failed.
      await admin.acl(
        'SETUSER',
        'nocounter',
        'on',
        '>pw',
        ...RECIPE.map((r) => r.replace('~lock:*', '~lock:{[a-z]*')),
      );
      for (const [username, refused] of [
        ['nozadd', /ZADD: /],
        ['nohget', /HGET: /],
        ['otherkeys', /EVAL: NOPERM .*keys used as arguments/],
        ['nocounter', /EVAL: NOPERM .*keys used as arguments/],
        ['noevalsha', /EVALSHA: /],
      ] as const) {
        const { error } = await boot(username);
        assert.ok(error instanceof RedisLockConfigurationError, `${username}: ${String(error)}`);
        assert.equal(error.option, 'Redis user');
        assert.match(error.message, refused, username);
        assert.match(error.message, /Least-privilege Redis user/);
      }
    });

    it('Redlock: each node is checked, and the one whose user is refused is named', async () => {
      const nodes = await Promise.all([0, 1, 2].map(() => startRedis()));
      try {
        await Promise.all(
          nodes.map(async (node, i) => {
            const client = new Redis(node.url);
            const rules = i === 1 ? RECIPE.filter((rule) => rule !== '+zadd') : RECIPE;
            await client.acl('SETUSER', 'app', 'on', '>pw', ...rules);
            client.disconnect();
          }),
        );
        const urls = nodes.map((node) => `redis://app:pw@127.0.0.1:${node.port}`);
        const module = await Test.createTestingModule({
          imports: [RedisLockModule.forRoot({ nodes: urls })],
        }).compile();
        const error = await module.init().then(
          () => undefined,
          (e: unknown) => e,
        );
        await module.close();
        assert.ok(error instanceof RedisLockConfigurationError, String(error));
        assert.equal(error.option, 'Redis user of nodes[1]');
        assert.match(error.message, /ZADD: /);
      } finally {
        await Promise.all(nodes.map((node) => node.stop()));
      }
    });

    it('a user without the channels boots with a warning; the recipe boots with none', async () => {
      const warned = await boot('nochannels');
      assert.equal(warned.error, undefined, String(warned.error));
      assert.equal(
        warned.lines.filter((line) => line.startsWith('The Redis user may not publish')).length,
        1,
        warned.lines.join('\n'),
      );
      const clean = await boot('locks');
      assert.equal(clean.error, undefined, String(clean.error));
      assert.deepEqual(
        clean.lines.filter((line) => /Redis user|refused/.test(line)),
        [],
      );
    });
  });
});

/**
 * The recipe's extras for a Cluster (sharded pub/sub and what ioredis asks to find the slots) and
 * for `replicaAck` (`WAIT`), run as written in the topologies guide.
 */
describe("a least-privilege Redis user: the recipe's extras", () => {
  const user = (extras: readonly string[]) => ['on', '>pw', ...RECIPE, ...extras];

  it('on a Cluster: every shape, waiters woken by the release (SPUBLISH), no warning', async () => {
    const cluster = await startCluster(3);
    // What ioredis' Cluster client asks besides: the slots, each node's state (its ready check),
    // and names for its connections.
    const extras = [
      '+spublish',
      '+ssubscribe',
      '+sunsubscribe',
      '+cluster|slots',
      '+cluster|info',
      '+client|setname',
    ];
    const admins = cluster.nodes.map((node) => new Redis(node.port, node.host));
    const clients: Cluster[] = [];
    try {
      for (const admin of admins) await admin.acl('SETUSER', 'locks', ...user(extras));
      const client = (): Cluster => {
        const made = new Cluster(
          cluster.nodes.map((node) => ({ host: node.host, port: node.port })),
          { redisOptions: { username: 'locks', password: 'pw' } },
        );
        clients.push(made);
        return made;
      };
      const lines = await twoApps(() => ({ client: client() }), false);
      assert.deepEqual(
        lines.filter((line) => line.level === 'warn'),
        [],
      );
    } finally {
      for (const made of clients) made.disconnect();
      for (const admin of admins) admin.disconnect();
      await cluster.stop();
    }
  });

  it('with replicaAck: every shape, each write confirmed by the replica (WAIT), no warning', async () => {
    const master = await startRedis();
    const replica = await startRedis(['--replicaof', master.host, String(master.port)]);
    const admin = new Redis(master.url);
    try {
      await admin.acl('SETUSER', 'locks', ...user(['+wait']));
      const onReplica = new Redis(replica.port, replica.host);
      const linked = await eventually(async () =>
        (await onReplica.info('replication')).includes('link_status:up'),
      );
      onReplica.disconnect();
      assert.ok(linked, 'the replica follows the master');
      // And acknowledges what the master wrote (a replica whose link is up may still be loading
      // the master's data). The acknowledgements get 2.5 s each: with a CPU burner on both cores
      // beside the whole suite (`test:repeat --burn`), a replica once took over 1 s, twice in a
      // row; the property here is that every write is confirmed, not how fast.
      await admin.set('acl-probe', '1');
      assert.equal(await admin.call('WAIT', '1', '10000'), 1, 'the replica acknowledges writes');
      await admin.del('acl-probe');
      const lines = await twoApps(
        {
          connection: { host: master.host, port: master.port, username: 'locks', password: 'pw' },
          replicaAck: { replicas: 1, timeout: 2_500 },
          commandTimeout: 5_000,
        },
        false,
      );
      assert.deepEqual(
        lines.filter((line) => line.level === 'warn'),
        [],
      );
    } finally {
      admin.disconnect();
      await replica.stop();
      await master.stop();
    }
  });
});
