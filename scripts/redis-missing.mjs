// What the scripts say when there is no redis-server to start, instead of a `spawn ENOENT` stack.
import { spawnSync } from 'node:child_process';

/** The advice, for `what` (the command that needs a Redis). */
export const redisMissing = (what) =>
  `${what} needs redis-server, which is not on the PATH. Install it (Debian/Ubuntu: ` +
  '`sudo apt-get install redis-server`; macOS: `brew install redis`), or point REDIS_SERVER_BIN ' +
  'at one' +
  (what === 'npm test' ? '.' : ', or set REDIS_URL to a Redis you have.');

/** Whether `binary` (default: redis-server) can be run. */
export function hasRedisServer(binary = process.env.REDIS_SERVER_BIN ?? 'redis-server') {
  return spawnSync(binary, ['--version'], { stdio: 'ignore' }).error === undefined;
}
