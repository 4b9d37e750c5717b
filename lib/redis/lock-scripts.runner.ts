import { createHash } from 'node:crypto';
import { Command, type Cluster, type Redis } from 'ioredis';

/** A Lua script and how many of its arguments are keys (undefined: the caller passes the count). */
export interface ScriptDefinition {
  lua: string;
  numberOfKeys?: number;
}

/** Runs a script: its keys, then its other arguments (with the key count first if it varies). */
export type ScriptCall = (...args: (string | number)[]) => Promise<unknown>;

/** How `EVALSHA` of one script is written: what follows the argument count, and what it covers. */
interface Written {
  /** The command name, the SHA and, where it is fixed, the key count, in the wire protocol. */
  readonly head: string;
  /** How many of the arguments `head` carries (1, or 2 with the key count). */
  readonly fixed: number;
}

/** What a command is constructed with before its arguments are set (see `ScriptCommand`). */
const NO_ARGS: never[] = [];
const UTF8 = { replyEncoding: 'utf8' } as const;

/** One argument in the wire protocol (RESP bulk string). */
const bulk = (arg: string): string => `$${Buffer.byteLength(arg)}\r\n${arg}\r\n`;

/**
 * `EVALSHA` of a lock script, its arguments already strings. ioredis' own construction flattens
 * the arguments with `Array.prototype.flat()`, which on Node 20 costs ~1.5 µs for a lock script's
 * seven (measured; the rest of the constructor, ~0.3 µs), and writes each command by concatenating
 * its name and every argument anew. Here the arguments are set after construction, and the command
 * is written from a head computed once per script, then the arguments. `args` stays what ioredis
 * expects, so a Cluster routes the command by its first key, and follows a MOVED or ASK with it,
 * as it would any command.
 */
class ScriptCommand extends Command {
  constructor(
    private readonly written: Written,
    args: string[],
  ) {
    super('evalsha', NO_ARGS, UTF8);
    this.args = args;
  }

  override toWritable(): string {
    const args = this.args as string[];
    let text = `*${args.length + 1}${this.written.head}`;
    for (let i = this.written.fixed; i < args.length; i++) text += bulk(args[i]);
    return text;
  }
}

/**
 * The lock scripts as functions that send `EVALSHA` straight through the client's `sendCommand`.
 * Each is also defined on the client as an ioredis command (`defineCommand`), which pipelines use
 * (`replicaAck`); a direct call skips that wrapper, which copies the arguments, wraps every reply
 * in a promise of its own for its `NOSCRIPT` fallback and tracks scripts per socket: measured,
 * ~3–5 µs of client CPU per acquire + release on loopback. A `NOSCRIPT` reply (a server restarted
 * empty, `SCRIPT FLUSH`, a node promoted since the script was loaded) is answered by sending the
 * script itself with `EVAL`, which loads it. A client with a `keyPrefix` of its own gets ioredis'
 * ordinary commands, which prefix the keys as they would for a defined command.
 */
export function lockScripts<Name extends string>(
  client: Redis | Cluster,
  definitions: Record<Name, ScriptDefinition>,
): Record<Name, ScriptCall> {
  const { keyPrefix } = client.options as { keyPrefix?: string };
  const prefixed = { ...UTF8, keyPrefix };
  const calls = {} as Record<Name, ScriptCall>;
  for (const name of Object.keys(definitions) as Name[]) {
    const { lua, numberOfKeys } = definitions[name];
    client.defineCommand(name, numberOfKeys === undefined ? { lua } : { lua, numberOfKeys });
    const sha = createHash('sha1').update(lua).digest('hex');
    const first = numberOfKeys === undefined ? [sha] : [sha, String(numberOfKeys)];
    const written: Written = {
      head: `\r\n${bulk('evalsha')}${first.map(bulk).join('')}`,
      fixed: first.length,
    };
    const send = (command: string, args: string[]): Promise<unknown> =>
      client.sendCommand(
        keyPrefix
          ? new Command(command, args, prefixed)
          : command === 'evalsha'
            ? new ScriptCommand(written, args)
            : new Command(command, args, UTF8),
      ) as Promise<unknown>;
    calls[name] = (...args) => {
      // [sha, key count?, ...args], all strings, built in one pass.
      const all = first.slice();
      for (const arg of args) all.push(typeof arg === 'string' ? arg : String(arg));
      return send('evalsha', all).then(undefined, (error: unknown) => {
        if (!(error instanceof Error && error.message.startsWith('NOSCRIPT'))) throw error;
        all[0] = lua;
        return send('eval', all);
      });
    };
  }
  return calls;
}
