import { spawn, type ChildProcess } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

/** A redis-server process this harness started, on a loopback port nobody else uses. */
export interface RedisServer {
  readonly host: '127.0.0.1';
  readonly port: number;
  readonly url: string;
  readonly pid: number;
  /** Stops the server (SIGTERM, no persistence) and waits until it has exited. */
  stop(): Promise<void>;
  /** Sends a signal without waiting (SIGSTOP / SIGCONT to freeze and thaw it). */
  signal(signal: NodeJS.Signals): void;
  /** SIGKILL (a crash: no clean close of client sockets), and waits until it has exited. */
  kill(): Promise<void>;
  /** Starts a fresh server (empty: no persistence) on the same port, after kill() or stop(). */
  restart(): Promise<RedisServer>;
}

const binary = process.env.REDIS_SERVER_BIN ?? 'redis-server';
/** Each server still running, and its directory. */
const running = new Map<ChildProcess, string>();
// Whatever happens to the test process, the servers it started die with it, and their
// directories go (their exit, which removes them otherwise, comes after this process's).
process.on('exit', () => {
  for (const [child, dir] of running) {
    child.kill('SIGKILL');
    rmSync(dir, { recursive: true, force: true });
  }
});

/** Starts a private redis-server with no persistence on a free 127.0.0.1 port. */
/**
 * A redis-server on a free loopback port; `env` adds to its environment (a skewed clock, see
 * skewed-clock.ts), kept when it restarts.
 */
export function startRedis(
  extraArgs: readonly string[] = [],
  env?: Record<string, string>,
): Promise<RedisServer> {
  return onFreePort(redisPlan(extraArgs, env));
}

function redisPlan(extraArgs: readonly string[], env?: Record<string, string>): LaunchPlan {
  return (port, dir) => [
    [
      '--port',
      String(port),
      '--bind',
      '127.0.0.1',
      '--protected-mode',
      'no',
      '--save',
      '',
      '--appendonly',
      'no',
      '--dir',
      dir,
      '--logfile',
      '',
      '--daemonize',
      'no',
      // A replica syncs at once instead of after the default 5 s wait for more replicas.
      '--repl-diskless-sync-delay',
      '0',
      ...extraArgs,
    ],
    'Ready to accept connections',
    env,
  ];
}

/**
 * Starts a Sentinel that monitors `master` under the name `masterName`; it takes the master for
 * down after `downAfterMs` without an answer.
 */
export function startSentinel(
  master: RedisServer,
  masterName = 'mymaster',
  quorum = 1,
  downAfterMs = 1_000,
): Promise<RedisServer> {
  return onFreePort((port, dir) => {
    // Sentinel insists on a config file it can rewrite.
    const config = join(dir, 'sentinel.conf');
    writeFileSync(
      config,
      [
        `port ${port}`,
        'bind 127.0.0.1',
        'protected-mode no',
        `dir ${dir}`,
        'logfile ""',
        `sentinel monitor ${masterName} ${master.host} ${master.port} ${quorum}`,
        `sentinel down-after-milliseconds ${masterName} ${downAfterMs}`,
        `sentinel failover-timeout ${masterName} 5000`,
        '',
      ].join('\n'),
    );
    return [[config, '--sentinel'], '+monitor master'];
  });
}

/** A master, its replica and three Sentinels (quorum 2) that know each other and the replica. */
export interface SentinelGroup {
  readonly name: string;
  readonly master: RedisServer;
  readonly replica: RedisServer;
  readonly sentinels: RedisServer[];
  /** The port the Sentinels name as the master right now. */
  masterPort(): Promise<number>;
  /** Waits until the Sentinels name `port` as the master; resolves when, in ms since `since`. */
  switchedTo(port: number, since: number): Promise<number>;
  stop(): Promise<void>;
}

export async function startSentinelGroup(
  name = 'mymaster',
  downAfterMs = 1_000,
): Promise<SentinelGroup> {
  const master = await startRedis();
  const replica = await startRedis(['--replicaof', master.host, String(master.port)]);
  const servers = [master, replica];
  const stop = async (): Promise<void> => {
    await Promise.all(servers.map((server) => server.stop()));
  };
  try {
    await until(
      async () =>
        (await run('redis-cli', ['-p', String(replica.port), 'info', 'replication'])).includes(
          'master_link_status:up',
        ),
      'the replica never synced with its master',
    );
    const sentinels = await Promise.all(
      [0, 1, 2].map(() => startSentinel(master, name, 2, downAfterMs)),
    );
    servers.push(...sentinels);
    // Sentinels find each other through the master's hello channel (every 2 s).
    for (const sentinel of sentinels) {
      await until(async () => {
        const info = await run('redis-cli', [
          '-p',
          String(sentinel.port),
          'sentinel',
          'master',
          name,
        ]);
        const field = (label: string): number =>
          Number(new RegExp(`${label}\\n(\\d+)`).exec(info)?.[1]);
        return field('num-other-sentinels') === 2 && field('num-slaves') === 1;
      }, 'the Sentinels never saw each other and the replica');
    }
    const masterPort = async (): Promise<number> => {
      const reply = await run('redis-cli', [
        '-p',
        String(sentinels[0].port),
        'sentinel',
        'get-master-addr-by-name',
        name,
      ]);
      return Number(reply.trim().split('\n')[1]);
    };
    return {
      name,
      master,
      replica,
      sentinels,
      masterPort,
      switchedTo: async (port, since) => {
        await until(
          async () => (await masterPort()) === port,
          `Sentinel never switched to ${port}`,
        );
        return performance.now() - since;
      },
      stop,
    };
  } catch (error) {
    await stop();
    throw error;
  }
}

/** Polls `condition` every 20 ms for up to 30 s; throws `problem` if it never holds. */
export async function until(condition: () => Promise<boolean>, problem: string): Promise<void> {
  for (let tries = 0; !(await condition().catch(() => false)); tries++) {
    if (tries > 1_500) throw new Error(problem);
    await new Promise((resolve) => setTimeout(resolve, 20));
  }
}

/** A Redis Cluster of harness-started nodes, every slot assigned and ok. */
export interface RedisClusterFixture {
  /** Every node: the masters first, then their replicas (in `redis-cli --cluster create` order). */
  readonly nodes: RedisServer[];
  /** Runs a command on a node through redis-cli; resolves its output. */
  cli(node: RedisServer, ...args: string[]): Promise<string>;
  /** The node that serves `slot` as master right now. */
  /** The master that serves `slot`, as the first of `by` that answers sees it (default: any node). */
  ownerOf(slot: number, by?: readonly RedisServer[]): Promise<RedisServer>;
  /** The slot ranges each master serves right now. */
  slotTable(): Promise<Map<RedisServer, [number, number][]>>;
  /**
   * Starts a killed node again on its port, empty (its nodes.conf is gone, so it is a new node
   * id), and adds it as a replica of `master`; every node forgets its old id. It takes the dead
   * node's place in `nodes`.
   */
  restartAsReplica(dead: RedisServer, master: RedisServer): Promise<RedisServer>;
  stop(): Promise<void>;
}

/**
 * Starts `masters` masters and `replicas` replicas of each (`redis-cli --cluster create`), and
 * waits until every node reports `cluster_state:ok` and every replica is in sync. A master that
 * does not answer for `nodeTimeoutMs` is failed over to its replica.
 */
export async function startCluster(
  masters = 3,
  replicas = 0,
  nodeTimeoutMs = 2_000,
): Promise<RedisClusterFixture> {
  const nodes = await Promise.all(
    Array.from({ length: masters * (1 + replicas) }, () =>
      startRedis([
        '--cluster-enabled',
        'yes',
        '--cluster-config-file',
        'nodes.conf',
        '--cluster-node-timeout',
        String(nodeTimeoutMs),
      ]),
    ),
  );
  const stop = async (): Promise<void> => {
    await Promise.all(nodes.map((node) => node.stop()));
  };
  const cli = (node: RedisServer, ...args: string[]): Promise<string> =>
    run('redis-cli', ['-p', String(node.port), ...args]);
  try {
    await run('redis-cli', [
      '--cluster',
      'create',
      ...nodes.map((n) => `${n.host}:${n.port}`),
      '--cluster-replicas',
      String(replicas),
      '--cluster-yes',
    ]);
    for (const node of nodes) {
      await until(
        async () => (await cli(node, 'cluster', 'info')).includes('cluster_state:ok'),
        `cluster node ${node.port} never reached cluster_state:ok`,
      );
      await until(async () => {
        const replication = await cli(node, 'info', 'replication');
        return replication.includes('role:master') || replication.includes('master_link_status:up');
      }, `replica ${node.port} never synced`);
    }
  } catch (error) {
    await stop();
    throw error;
  }
  /** Slot ranges of each master, as the first node of `by` that answers sees them. */
  const slotTable = async (
    by: readonly RedisServer[] = nodes,
  ): Promise<Map<RedisServer, [number, number][]>> => {
    for (const node of by) {
      const table = await cli(node, 'cluster', 'nodes').catch(() => undefined);
      if (table === undefined) continue;
      const owners = new Map<RedisServer, [number, number][]>();
      for (const line of table.trim().split('\n')) {
        // <id> <ip:port@bus> <flags> <master> <ping> <pong> <epoch> <link> <slot> <slot> ...
        const [, address, flags, , , , , , ...slots] = line.split(' ');
        // (A node killed mid-answer leaves a partial table: skip what is not a node line.)
        if (flags === undefined || !flags.split(',').includes('master') || flags.includes('fail')) {
          continue;
        }
        const owner = nodes.find((each) => each.port === Number(/:(\d+)@/.exec(address)?.[1]));
        if (!owner) continue;
        owners.set(
          owner,
          slots
            .filter((range) => !range.startsWith('['))
            .map((range) => {
              const [from, to = from] = range.split('-').map(Number);
              return [from, to];
            }),
        );
      }
      return owners;
    }
    throw new Error('no cluster node answers');
  };
  const ownerOf = async (slot: number, by?: readonly RedisServer[]): Promise<RedisServer> => {
    for (const [owner, ranges] of await slotTable(by)) {
      if (ranges.some(([from, to]) => from <= slot && slot <= to)) return owner;
    }
    throw new Error(`no owner found for slot ${slot}`);
  };
  const idOf = async (node: RedisServer): Promise<string> =>
    (await cli(node, 'cluster', 'myid')).trim();
  const restartAsReplica = async (dead: RedisServer, master: RedisServer): Promise<RedisServer> => {
    const oldId = (await cli(master, 'cluster', 'nodes'))
      .split('\n')
      .find((line) => line.split(' ')[1]?.startsWith(`${dead.host}:${dead.port}@`))
      ?.split(' ')[0];
    const fresh = await dead.restart();
    nodes[nodes.indexOf(dead)] = fresh;
    // Every node must forget the old id within a minute, or gossip brings it back.
    if (oldId) {
      await Promise.all(
        nodes
          .filter((node) => node !== fresh)
          .map((node) => cli(node, 'cluster', 'forget', oldId).catch(() => '')),
      );
    }
    const masterId = await idOf(master);
    await cli(fresh, 'cluster', 'meet', master.host, String(master.port));
    await until(
      async () => (await cli(fresh, 'cluster', 'nodes')).includes(masterId),
      `restarted node ${fresh.port} never met the cluster`,
    );
    await until(
      async () => (await cli(fresh, 'cluster', 'replicate', masterId)).startsWith('OK'),
      `restarted node ${fresh.port} never became a replica`,
    );
    await until(
      async () => (await cli(fresh, 'info', 'replication')).includes('master_link_status:up'),
      `restarted node ${fresh.port} never synced`,
    );
    return fresh;
  };
  return { nodes, cli, ownerOf, slotTable, restartAsReplica, stop };
}

/**
 * The cluster slot of `key`: CRC16 (XMODEM) of its hash tag, or of the whole key, mod 16384
 * (Redis Cluster specification, "Key distribution model").
 */
export function keySlot(key: string): number {
  const open = key.indexOf('{');
  const close = open < 0 ? -1 : key.indexOf('}', open + 1);
  const hashed = close > open + 1 ? key.slice(open + 1, close) : key;
  let crc = 0;
  for (const byte of Buffer.from(hashed)) {
    crc ^= byte << 8;
    for (let bit = 0; bit < 8; bit++)
      crc = crc & 0x8000 ? ((crc << 1) ^ 0x1021) & 0xffff : (crc << 1) & 0xffff;
  }
  return crc % 16384;
}

function run(command: string, args: string[]): Promise<string> {
  return new Promise((resolve, reject) => {
    const child = spawn(command, args, { stdio: ['ignore', 'pipe', 'pipe'] });
    let output = '';
    child.stdout.on('data', (chunk: Buffer) => (output += chunk.toString()));
    child.stderr.on('data', (chunk: Buffer) => (output += chunk.toString()));
    child.once('error', reject);
    // 'close', not 'exit': 'exit' may come before the output is read (a CI run got an empty
    // `cluster myid`, then "ERR I don't know about node" from the SETSLOT that used it).
    child.once('close', (code) =>
      code === 0 ? resolve(output) : reject(new Error(`${command} ${args.join(' ')}: ${output}`)),
    );
  });
}

type LaunchPlan = (
  port: number,
  dir: string,
) => [args: string[], readyLine: string, env?: Record<string, string>];

async function onFreePort(plan: LaunchPlan): Promise<RedisServer> {
  let lastError: unknown;
  for (let tries = 0; tries < 5; tries++) {
    try {
      return await launch(await freePort(), plan);
    } catch (error) {
      lastError = error; // most likely the port was taken between probe and bind: try another
    }
  }
  throw lastError;
}

/** A port that was free a moment ago on 127.0.0.1. */
export function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const probe = createServer();
    probe.unref();
    probe.once('error', reject);
    probe.listen(0, '127.0.0.1', () => {
      const address = probe.address();
      probe.close(() =>
        typeof address === 'object' && address
          ? resolve(address.port)
          : reject(new Error('no port')),
      );
    });
  });
}

/** Launches `plan` on `port`, which its previous owner (a killed server) may still hold briefly. */
async function relaunch(port: number, plan: LaunchPlan): Promise<RedisServer> {
  for (let tries = 0; ; tries++) {
    try {
      return await launch(port, plan);
    } catch (error) {
      if (tries >= 20) throw error;
      await new Promise((resolve) => setTimeout(resolve, 100));
    }
  }
}

function launch(port: number, plan: LaunchPlan): Promise<RedisServer> {
  const dir = mkdtempSync(join(tmpdir(), 'nestjs-redis-lock-'));
  const [args, readyLine, env] = plan(port, dir);
  const child = spawn(binary, args, {
    stdio: ['ignore', 'pipe', 'pipe'],
    env: env && { ...process.env, ...env },
  });
  running.set(child, dir);
  const exited = new Promise<void>((resolve) => child.once('exit', () => resolve()));
  void exited.then(() => {
    running.delete(child);
    rmSync(dir, { recursive: true, force: true });
  });

  return new Promise<RedisServer>((resolve, reject) => {
    let output = '';
    const timer = setTimeout(
      () => fail(new Error(`redis-server on ${port} not ready after 10 s:\n${output}`)),
      10_000,
    );
    const fail = (error: Error): void => {
      clearTimeout(timer);
      child.kill('SIGKILL');
      reject(error);
    };
    child.once('error', (error: NodeJS.ErrnoException) =>
      fail(
        new Error(
          error.code === 'ENOENT'
            ? `${binary} is not on the PATH. Install it (Debian/Ubuntu: \`sudo apt-get install redis-server\`; macOS: \`brew install redis\`), point REDIS_SERVER_BIN at one, or (the demo, the sample) set REDIS_URL to a Redis you have.`
            : `cannot start ${binary}: ${error.message}`,
        ),
      ),
    );
    const onEarlyExit = (code: number | null): void =>
      fail(new Error(`redis-server on ${port} exited (${code}):\n${output}`));
    child.once('exit', onEarlyExit);
    child.stderr.on('data', (chunk: Buffer) => (output += chunk.toString()));
    child.stdout.on('data', (chunk: Buffer) => {
      output += chunk.toString();
      if (!output.includes(readyLine)) return;
      clearTimeout(timer);
      child.off('exit', onEarlyExit);
      child.stdout.removeAllListeners('data');
      child.stdout.resume();
      resolve({
        host: '127.0.0.1',
        port,
        url: `redis://127.0.0.1:${port}`,
        pid: child.pid!,
        signal: (signal) => void child.kill(signal),
        kill: async () => {
          if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL');
          await exited;
        },
        restart: () => relaunch(port, plan),
        stop: async () => {
          if (child.exitCode === null && child.signalCode === null) {
            child.kill('SIGCONT');
            child.kill('SIGTERM');
          }
          await exited;
        },
      });
    });
  });
}
