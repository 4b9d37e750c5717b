import type { Logger } from '@nestjs/common';
import type { Cluster, Redis } from 'ioredis';
import { within } from '../utils/within.js';

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
    if (down) return;
    down = true;
    logger.warn(`${name} failed, reconnecting: ${error.message}`);
  });
  client.on('ready', () => {
    if (!down) return;
    down = false;
    logger.log(`${name} is back.`);
  });
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
 * reply, so a frozen Redis cannot hold shutdown hostage), then drop whatever is left.
 */
export async function closeQuietly(client: Redis | Cluster, timeoutMs: number): Promise<void> {
  closedByUs.add(client);
  if (client.status === 'ready') {
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
