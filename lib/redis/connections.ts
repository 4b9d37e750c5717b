import type { Logger } from '@nestjs/common';
import { Redis, type Cluster, type RedisOptions } from 'ioredis';
import type { BackendHealth } from '../interfaces/lock-backend.interface.js';
import { DEADLINE, within } from '../utils/within.js';

/** The connections `closeQuietly` ended: none of them is ever reconnected. */
const closedByUs = new WeakSet<Redis | Cluster>();

/**
 * Watches a connection this library owns: logs its outages, and keeps a Sentinel connection from
 * being ended for good by ioredis (see `reconnectAfterFailoverRace`).
 */
export function watchConnection(client: Redis | Cluster, name: string, logger: Logger): void {
  logOutages(client, name, logger);
  if ((client as Redis).options.sentinels)
    reconnectAfterFailoverRace(client as Redis, name, logger);
}

/**
 * Logs a connection's outages once each (ioredis reports every failed reconnection attempt, up
 * to every 50 ms): a warning when it fails, one line when it is back.
 */
function logOutages(client: Redis | Cluster, name: string, logger: Logger): void {
  let down = false;
  client.on('error', (error: Error) => {
    lastErrors.set(client, error);
    if (down) return;
    down = true;
    logger.warn(`${name} (${whereIs(client)}) failed, reconnecting: ${error.message}`);
  });
  client.on('ready', () => {
    lastErrors.delete(client);
    if (!down) return;
    down = false;
    logger.log(`${name} (${whereIs(client)}) is back.`);
  });
}

/** Each watched connection's last error while it is down (cleared when it is ready). */
const lastErrors = new WeakMap<Redis | Cluster, Error>();

/** Where `client` connects, for messages: host:port, the Sentinels' master name, or the Cluster. */
function whereIs(client: Redis | Cluster): string {
  if ((client as { isCluster?: boolean }).isCluster) return 'the Redis Cluster';
  const { host, port, sentinels, name } = (client as Redis).options;
  if (sentinels) return `master "${name}" through Sentinel`;
  return `${host ?? '127.0.0.1'}:${port ?? 6379}`;
}

/**
 * What a command's failure says, in words a user can act on: ioredis' own message when the
 * connection is down ("Reached the max retries per request limit (which is 0)…", an option the
 * module set itself) becomes which Redis is unreachable and why (the connection's last error:
 * refused, a timeout, auth). Anything else is returned as it is.
 */
export function explainFailure(client: Redis | Cluster, error: unknown): unknown {
  if (!(error instanceof Error)) return error;
  const connectionDown =
    error.name === 'MaxRetriesPerRequestError' ||
    error.message === CONNECTION_CLOSED ||
    error.message.startsWith("Stream isn't writeable");
  if (!connectionDown) return error;
  return new Error(unreachable(client) ?? `Redis at ${whereIs(client)} is unreachable`, {
    cause: error,
  });
}

/**
 * Which Redis `client` cannot reach and why (its connection's last error), while its connection
 * is down; `undefined` while it is up (or for a client the module does not watch: your own).
 */
export function unreachable(client: Redis | Cluster): string | undefined {
  const error = lastErrors.get(client);
  return error && `Redis at ${whereIs(client)} is unreachable (${error.message})`;
}

/** The message of the error ioredis rejects a connection attempt with when it was cut short. */
const CONNECTION_CLOSED = 'Connection is closed.';

/**
 * Reconnects a Sentinel connection that ioredis ended although nobody closed it. ioredis (5 and 6)
 * does that after a race of its own: when a connection's master died, the connection's failover
 * detector is still subscribed to the Sentinels; if their `+switch-master` arrives while a
 * reconnection attempt is asking a Sentinel where the master is, the detector aborts that attempt,
 * which fails with "Connection is closed.", and ioredis then sets the status `end`, which it never
 * leaves by itself: every later command fails at once with the same message, until the app
 * restarts (redis/ioredis#1683 reports the symptom; our killed-master failover test once lost its
 * connection so). The signature is that error, which ioredis emits only when nobody is closing the
 * connection, followed by `end`; a connection `closeQuietly` ended is left alone.
 */
function reconnectAfterFailoverRace(client: Redis, name: string, logger: Logger): void {
  let attemptCutShort = false;
  client.on('error', (error: Error) => {
    attemptCutShort = error.message === CONNECTION_CLOSED;
  });
  client.on('end', () => {
    if (!attemptCutShort || closedByUs.has(client) || client.status !== 'end') return;
    attemptCutShort = false;
    logger.warn(`${name} was ended by ioredis during a Sentinel failover; connecting again.`);
    client.connect().catch(() => {
      // Reported through the 'error' event; ioredis' retry strategy takes over from here.
    });
  });
}

/**
 * Ends a connection this library owns: QUIT when it is up (waiting at most `timeoutMs` for the
 * reply, so a frozen Redis cannot hold shutdown hostage; with no time left, none is sent), then
 * drop whatever is left.
 */
export async function closeQuietly(client: Redis | Cluster, timeoutMs: number): Promise<void> {
  closedByUs.add(client);
  if (client.status === 'ready' && timeoutMs > 0) {
    try {
      await within(client.quit(), timeoutMs, []);
    } catch {
      // Fall through to a hard disconnect.
    }
  }
  // Also after QUIT: it ends the connection but not what ioredis keeps beside it (a Sentinel
  // client's failover detector, with its own connections to every Sentinel).
  client.disconnect();
}

/** What went wrong with a Redis call, for a health report or a log line. */
export function describeFailure(error: unknown, commandTimeout: number): string {
  if (error === DEADLINE) return `no reply within commandTimeout (${commandTimeout} ms)`;
  return error instanceof Error ? error.message : String(error);
}

/**
 * Creates a client the module owns for a `connection` (or a Redlock node given as a URL or
 * options), with `OWN_CONNECTION_DEFAULTS` under the caller's options and no socket opened yet.
 */
export function createClient(connection: string | RedisOptions, logger: Logger): Redis {
  const client =
    typeof connection === 'string'
      ? new Redis(connection, { ...OWN_CONNECTION_DEFAULTS, lazyConnect: true })
      : new Redis({
          ...OWN_CONNECTION_DEFAULTS,
          ...(connection.sentinels ? SENTINEL_DEFAULTS : {}),
          ...connection,
          lazyConnect: true,
        });
  watchConnection(client, 'Redis connection', logger);
  return client;
}

/**
 * What the module sets on connections it creates (a `client` you pass is never reconfigured;
 * `commandTimeout` bounds every call on it all the same). Your `connection` options override these.
 * - `maxRetriesPerRequest: 0`: a command sent while Redis is unreachable fails at the next failed
 *   reconnection attempt instead of queueing through 20 of them, so a down Redis is reported at
 *   once and a stale lock command is not sent long after its caller gave up.
 * - `autoResendUnfulfilledCommands: false`: a lock command whose reply was lost with the connection
 *   is not sent again after reconnecting; its caller was already told `LockBackendError`.
 * - `reconnectOnError`: reconnect after a `READONLY` error (see `reconnectOnReadOnly`).
 * - The offline queue stays on (the first command must wait for the lazy connection) and the
 *   reconnection strategy is ioredis' own (retry forever, backing off to 2 s): when Redis comes
 *   back, locking resumes by itself.
 * `lazyConnect: true` is added over your options: no socket is opened before the first lock
 * command, so an app whose bootstrap fails later never leaks a connection it cannot close.
 */
const OWN_CONNECTION_DEFAULTS = {
  maxRetriesPerRequest: 0,
  autoResendUnfulfilledCommands: false,
  reconnectOnError: reconnectOnReadOnly,
} as const satisfies RedisOptions;

/**
 * Also set on connections the module creates through Sentinel (`connection: { sentinels, name }`):
 * - `failoverDetector: true`: ioredis listens to the Sentinels' `+switch-master` and reconnects to
 *   the new master at once. Without it, a connection to a demoted master keeps going there
 *   (measured: locks were taken again ~11 s after `SENTINEL FAILOVER`; with it, ~0.2 s after
 *   Sentinel switched).
 * - `retryStrategy`: reconnect every 50, 100, ... up to 250 ms (ioredis' own backs off to 2 s). When
 *   the master died, each try asks the Sentinels where the master is, so locking resumes within a
 *   quarter second of Sentinel's switch instead of up to two.
 */
const SENTINEL_DEFAULTS = {
  failoverDetector: true,
  retryStrategy: (times: number) => Math.min(times * 50, 250),
} as const satisfies RedisOptions;

/**
 * `reconnectOnError` of connections the module creates: a `READONLY` reply means the server is a
 * replica now (a failover demoted it, or a DNS name moved): reconnect, which through Sentinel asks
 * for the current master. The failed command is not sent again (its caller got `LockBackendError`).
 */
function reconnectOnReadOnly(error: Error): boolean {
  return error.message.includes('READONLY');
}

/** Whether Redis answers a PING within `commandTimeout`, and how fast. Never rejects. */
export async function pingHealth(
  client: Redis | Cluster,
  commandTimeout: number,
): Promise<BackendHealth> {
  const started = performance.now();
  try {
    await within(client.ping(), commandTimeout, []);
    return { up: true, details: { latencyMs: round(performance.now() - started) } };
  } catch (error) {
    // While the connection is down, why (refused, auth, a timeout) says more than a PING's
    // silence or ioredis' retry-limit message.
    const why =
      unreachable(client) ?? describeFailure(explainFailure(client, error), commandTimeout);
    return { up: false, details: { error: why } };
  }
}

const round = (ms: number): number => Math.round(ms * 100) / 100;

/** What `serverInfo` reads of a server: unknown fields are `undefined`. */
export interface ServerInfo {
  /** `run_id`: new at every start of redis-server, what tells one server from another. */
  readonly id: string | undefined;
  /** `redis_version`. */
  readonly version: string | undefined;
}

/**
 * The server's `run_id` and version (`INFO server`), asked within `commandTimeout`; both
 * `undefined` if it does not answer in time.
 */
export async function serverInfo(
  client: Redis | Cluster,
  commandTimeout: number,
): Promise<ServerInfo> {
  const info = await within(client.info('server'), commandTimeout, []).catch(() => '');
  return {
    id: /^run_id:(\w+)/m.exec(info)?.[1],
    version: /^redis_version:([\d.]+)/m.exec(info)?.[1],
  };
}

/** The oldest Redis the scripts run on: `PEXPIRE … GT` and `SPUBLISH` came with 7.0. */
const OLDEST = [7, 0];

/**
 * What is wrong with a server of `version` (see `OLDEST`), or `undefined`: the scripts would fail
 * at the first lock, with an error that names no version.
 */
export function versionProblem(version: string | undefined): string | undefined {
  if (version === undefined) return undefined;
  const [major = 0, minor = 0] = version.split('.').map(Number);
  if (major > OLDEST[0] || (major === OLDEST[0] && minor >= OLDEST[1])) return undefined;
  return `this library needs Redis ${OLDEST.join('.')} or newer (its scripts use SET … GET from 6.2, PEXPIRE … GT and, on a Cluster, SPUBLISH from 7.0): upgrade the server`;
}

/**
 * Calls `listener` each time `client` is ready again after its connection closed. Listening
 * changes nothing on a client the app passed in. Returns what stops it.
 */
export function onReconnect(client: Redis | Cluster, listener: () => void): () => void {
  let dropped = false;
  const onClose = (): void => void (dropped = true);
  const onReady = (): void => {
    if (!dropped) return;
    dropped = false;
    listener();
  };
  client.on('close', onClose).on('ready', onReady);
  return () => void client.off('close', onClose).off('ready', onReady);
}

/**
 * Calls `listener` each time a connection of `client` closes: its own, or on a Cluster any node's
 * (a node's connection closing is all a Cluster client shows of a master killed under it).
 * Listening changes nothing on a client the app passed in. Returns what stops it.
 */
export function onConnectionLoss(client: Redis | Cluster, listener: () => void): () => void {
  const cluster =
    (client as { isCluster?: boolean }).isCluster === true ? (client as Cluster) : undefined;
  const watchNode = (node: Redis): void => void node.on('close', listener);
  client.on('close', listener);
  if (cluster) {
    cluster.nodes('all').forEach(watchNode);
    cluster.on('+node', watchNode);
  }
  return () => {
    client.off('close', listener);
    if (!cluster) return;
    cluster.off('+node', watchNode);
    for (const node of cluster.nodes('all')) node.off('close', listener);
  };
}
