import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { versionProblem } from '../../lib/redis/connections.js';

/** The oldest Redis the scripts run on is checked when the app starts (see `RedisDeployment`). */
describe('the Redis version checked at startup', () => {
  it('refuses servers older than 7.0, names what they lack, and lets 7.0 and newer (or an unknown version) through', () => {
    for (const old of ['6.2.14', '6.0.20', '5.0.14', '2.8.24']) {
      assert.match(versionProblem(old) ?? '', /Redis 7\.0 or newer.*PEXPIRE … GT/, old);
    }
    for (const fine of ['7.0.0', '7.0.15', '7.2.4', '7.4.1', '8.0.0', '10.1.2', undefined]) {
      assert.equal(versionProblem(fine), undefined, fine);
    }
  });
});
