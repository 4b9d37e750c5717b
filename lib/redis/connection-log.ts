import type { Logger } from '@nestjs/common';
import type { Cluster, Redis } from 'ioredis';

/**
 * Logs a connection's outages once each (ioredis reports every failed reconnection attempt, up
 * to every 50 ms): a warning when it fails, one line when it is back.
 */
export function logOutages(client: Redis | Cluster, name: string, logger: Logger): void {
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
