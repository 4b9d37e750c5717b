/**
 * Redis servers whose clocks are off (see skewed-clock.c): `skewedClock({ offsetMs, rate })` gives
 * the environment to start a redis-server with (`startRedis([], env)`). The shim is compiled once
 * per source version with the system's C compiler (`cc`) into the temporary directory.
 */
import { execFile } from 'node:child_process';
import { createHash } from 'node:crypto';
import { existsSync, readFileSync, renameSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';

/** How a server's clock is off: `offsetMs` ahead (behind if negative), running `rate` × real time. */
export interface ClockSkew {
  offsetMs: number;
  rate: number;
}

const source = join(import.meta.dirname, '../../../test/support/skewed-clock.c');
let built: Promise<string> | undefined;

export async function skewedClock(skew: ClockSkew): Promise<Record<string, string>> {
  built ??= build();
  return {
    LD_PRELOAD: await built,
    SKEWED_CLOCK_OFFSET_MS: String(skew.offsetMs),
    SKEWED_CLOCK_RATE: String(skew.rate),
  };
}

async function build(): Promise<string> {
  const code = readFileSync(source);
  const hash = createHash('sha256').update(code).digest('hex').slice(0, 12);
  const library = join(tmpdir(), `nestjs-redis-lock-skewed-clock-${hash}.so`);
  if (existsSync(library)) return library;
  const partial = `${library}.${process.pid}`;
  try {
    await promisify(execFile)('cc', ['-shared', '-fPIC', '-O2', '-o', partial, source]);
  } catch (error) {
    throw new Error(
      (error as NodeJS.ErrnoException).code === 'ENOENT'
        ? 'Redis servers with skewed clocks need a C compiler: install one (Debian/Ubuntu: `sudo apt-get install gcc`; macOS: `xcode-select --install`).'
        : `cannot build ${source}: ${(error as Error).message}`,
    );
  }
  renameSync(partial, library);
  return library;
}
