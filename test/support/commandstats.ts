import type { Redis } from 'ioredis';

/**
 * How many scripts (`EVALSHA` and `EVAL` calls, from `INFO commandstats`) each of `servers` has run
 * since it started; 0 for a server that does not answer (paused, restarting).
 */
export async function scriptsRunOn(servers: readonly Redis[]): Promise<number[]> {
  return Promise.all(
    servers.map(async (redis) => {
      const info = await redis.info('commandstats').catch(() => '');
      const calls = (name: string): number =>
        Number(new RegExp(`cmdstat_${name}:calls=(\\d+)`).exec(info)?.[1] ?? 0);
      return calls('evalsha') + calls('eval');
    }),
  );
}
