import { createHash } from 'node:crypto';
import { createConnection, type Socket } from 'node:net';

/** One command as Redis's MONITOR reports it. */
export interface MonitoredCommand {
  /** Command name and arguments, the name lower-cased. */
  readonly args: string[];
  /** `ip:port` of the client connection that sent it. */
  readonly source: string;
}

/**
 * Records every command a Redis server executes, through MONITOR on a raw socket (ioredis's own
 * monitor() can mistake a monitor line for a reply under load). Resolves once MONITOR is on.
 * `caughtUp()` resolves once every command Redis executed before it was called is in `commands`:
 * MONITOR reports commands in the order Redis runs them, on a socket of its own, so it sends a
 * marker (`ECHO`) on another connection and waits for it to come back through MONITOR.
 */
export async function monitorRedis(
  port: number,
  host = '127.0.0.1',
): Promise<{
  readonly commands: MonitoredCommand[];
  caughtUp(): Promise<void>;
  stop(): void;
}> {
  const commands: MonitoredCommand[] = [];
  const markers = new Map<string, () => void>();
  const socket: Socket = createConnection({ port, host });
  let buffer = '';
  await new Promise<void>((resolve, reject) => {
    socket.once('error', reject);
    socket.on('data', (chunk: Buffer) => {
      buffer += chunk.toString('latin1');
      let end: number;
      while ((end = buffer.indexOf('\r\n')) >= 0) {
        const line = buffer.slice(0, end);
        buffer = buffer.slice(end + 2);
        if (line === '+OK') resolve();
        const parsed = /^\+\d+\.\d+ \[\d+ ([^\]]+)\] (.*)$/.exec(line);
        if (!parsed) continue;
        const command = { source: parsed[1], args: parseQuoted(parsed[2]) };
        if (command.args[0] === 'echo' && markers.has(command.args[1])) {
          markers.get(command.args[1])!();
          continue;
        }
        commands.push(command);
      }
    });
    socket.write('MONITOR\r\n');
  });
  let nextMarker = 0;
  const caughtUp = async (): Promise<void> => {
    const marker = `monitor-caught-up-${process.pid}-${nextMarker++}`;
    const seen = new Promise<void>((resolve) => markers.set(marker, resolve));
    const sender = createConnection({ port, host });
    sender.on('error', () => {}); // the wait below says what went wrong
    let timer: NodeJS.Timeout | undefined;
    try {
      sender.write(`*2\r\n$4\r\nECHO\r\n$${marker.length}\r\n${marker}\r\n`);
      await Promise.race([
        seen,
        new Promise<never>((_, reject) => {
          timer = setTimeout(
            () => reject(new Error(`MONITOR on ${host}:${port} never showed its marker in 10 s`)),
            10_000,
          );
        }),
      ]);
    } finally {
      clearTimeout(timer);
      markers.delete(marker);
      sender.destroy();
    }
  };
  return { commands, caughtUp, stop: () => void socket.destroy() };
}

/** Splits `"evalsha" "abc" "2"` into its unescaped strings. */
function parseQuoted(text: string): string[] {
  const args: string[] = [];
  const token = /"((?:[^"\\]|\\.)*)"/g;
  for (let match = token.exec(text); match; match = token.exec(text)) {
    args.push(
      match[1].replace(
        /\\x([0-9a-f]{2})|\\(.)/gi,
        (_all, hex: string | undefined, char: string) => {
          if (hex) return String.fromCharCode(parseInt(hex, 16));
          return ({ n: '\n', r: '\r', t: '\t' } as Record<string, string>)[char] ?? char;
        },
      ),
    );
  }
  if (args.length > 0) args[0] = args[0].toLowerCase();
  return args;
}

/** The commands of `commands` that ran `script` (EVALSHA, or EVAL after a NOSCRIPT) on `key`. */
export function scriptCallsOf(
  commands: readonly MonitoredCommand[],
  script: string,
  key: string,
): MonitoredCommand[] {
  const sha = createHash('sha1').update(script).digest('hex');
  return commands
    .filter(
      ({ args }) =>
        (args[0] === 'evalsha' && args[1] === sha) || (args[0] === 'eval' && args[1] === script),
    )
    .filter(({ args }) => args[3] === key);
}

/** How many of `commands` ran `script` on `key` (see `scriptCallsOf`). */
export function scriptCalls(
  commands: readonly MonitoredCommand[],
  script: string,
  key: string,
): number {
  return scriptCallsOf(commands, script, key).length;
}

/**
 * The scripts run on `key` (evalsha), in order, one letter each: the letter `letters` gives the
 * script, or `other` for any other.
 */
export function scriptSequence(
  commands: readonly MonitoredCommand[],
  key: string,
  letters: ReadonlyArray<readonly [script: string, letter: string]>,
  other: string,
): string {
  const bySha = new Map(
    letters.map(([script, letter]) => [createHash('sha1').update(script).digest('hex'), letter]),
  );
  return commands
    .filter(({ args }) => args[0] === 'evalsha' && args[3] === key)
    .map(({ args }) => bySha.get(args[1]) ?? other)
    .join('');
}
