import { createHash } from 'node:crypto';
import { Command, type Cluster, type Redis } from 'ioredis';

/** A Lua script and how many of its arguments are keys (undefined: the caller passes the count). */
export interface ScriptDefinition {
  lua: string;
  numberOfKeys?: number;
}

/** Runs a script: its keys, then its other arguments (with the key count first if it varies). */
export type ScriptCall = (...args: (string | number)[]) => Promise<unknown>;

/**
 * The lock scripts as functions that send `EVALSHA` straight through the client's `sendCommand`.
 * Each is also defined on the client as an ioredis command (`defineCommand`), which pipelines use
 * (`replicaAck`); a direct call skips that wrapper, which copies the arguments, wraps every reply
 * in a promise of its own for its `NOSCRIPT` fallback and tracks scripts per socket: measured,
 * ~3–5 µs of client CPU per acquire + release on loopback. A `NOSCRIPT` reply (a server restarted
 * empty, `SCRIPT FLUSH`, a node promoted since the script was loaded) is answered by sending the
 * script itself with `EVAL`, which loads it. The client's own `keyPrefix`, if any, applies as it
 * would to a defined command.
 */
export function lockScripts<Name extends string>(
  client: Redis | Cluster,
  definitions: Record<Name, ScriptDefinition>,
): Record<Name, ScriptCall> {
  const { keyPrefix } = client.options as { keyPrefix?: string };
  const options = keyPrefix
    ? { replyEncoding: 'utf8' as const, keyPrefix }
    : { replyEncoding: 'utf8' as const };
  const send = (name: string, args: (string | number)[]): Promise<unknown> =>
    client.sendCommand(new Command(name, args, options)) as Promise<unknown>;
  const calls = {} as Record<Name, ScriptCall>;
  for (const name of Object.keys(definitions) as Name[]) {
    const { lua, numberOfKeys } = definitions[name];
    client.defineCommand(name, numberOfKeys === undefined ? { lua } : { lua, numberOfKeys });
    const sha = createHash('sha1').update(lua).digest('hex');
    calls[name] = (...args) => {
      if (numberOfKeys !== undefined) args.unshift(numberOfKeys);
      return send('evalsha', [sha, ...args]).then(undefined, (error: unknown) =>
        error instanceof Error && error.message.startsWith('NOSCRIPT')
          ? send('eval', [lua, ...args])
          : Promise.reject(error as Error),
      );
    };
  }
  return calls;
}
