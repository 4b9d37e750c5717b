import type { Cluster, Redis } from 'ioredis';
import { LockReplicationError } from '../errors/redis-lock.errors.js';
import type { ReplicaAck } from '../interfaces/redis-lock-options.interface.js';
import type { AcquireCommand, EXTEND_COMMANDS, LockScriptArgs } from './lock-commands.js';

/** Most redirections (MOVED, READONLY) one `replicaAck` write follows (ioredis' own default is 16). */
const MAX_REDIRECTS = 5;

/** A lock script that writes: what `replicated` sends ahead of `WAIT`. */
export type ReplicatedCommand = AcquireCommand | (typeof EXTEND_COMMANDS)[number];

/**
 * With `replicaAck`: runs a lock script and `WAIT` right behind it on the same connection (a
 * pipeline: on Cluster, on the node that owns the key). Resolves the script's reply and how many
 * replicas acknowledged it.
 */
export async function replicated(
  client: Redis | Cluster,
  { replicas, timeout }: ReplicaAck,
  command: ReplicatedCommand,
  args: LockScriptArgs,
  redirects = 0,
): Promise<[reply: number, acknowledged: number]> {
  const pipeline = client.pipeline();
  (pipeline as unknown as Record<typeof command, (...args: unknown[]) => unknown>)[command](
    ...args,
  );
  const [[scriptError, reply], [waitError, acknowledged]] = (await pipeline
    .wait(replicas, timeout)
    .exec())!;
  // ioredis follows a MOVED in a cluster pipeline only when every command in it got one, and
  // WAIT (no key) does not. A READONLY comes from a master demoted a moment ago. Either way the
  // slot has a new owner: refresh the slot map (a pipeline is routed by it) and send the pair
  // again, a few times, pausing a little longer each time while the nodes' views converge.
  const isCluster = (client as { isCluster?: boolean }).isCluster === true;
  const message = isCluster ? (scriptError?.message ?? '') : '';
  if (/^(MOVED|READONLY) /.test(message) && redirects < MAX_REDIRECTS) {
    await new Promise<void>((resolve) => (client as Cluster).refreshSlotsCache(() => resolve()));
    if (redirects > 0) await new Promise((resolve) => setTimeout(resolve, 20 * redirects));
    return replicated(client, { replicas, timeout }, command, args, redirects + 1);
  }
  if (scriptError) throw scriptError;
  if (waitError) throw waitError;
  return [reply as number, acknowledged as number];
}

/** The error for a write that fewer replicas than asked acknowledged in time. */
export function unreplicated(
  key: string,
  operation: 'acquire' | 'extend',
  acknowledged: number,
  { replicas, timeout }: ReplicaAck,
): LockReplicationError {
  return new LockReplicationError(key, operation, replicas, acknowledged, timeout);
}
