#!/usr/bin/env node
// `npm run sample`: runs the sample app with `nest start`. Uses REDIS_URL when set; otherwise starts
// a private redis-server on a free port (when one is on the PATH) for as long as the sample runs,
// and says so: never a Redis it was not given (one on 6379 may hold someone else's data).
import { spawn } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { hasRedisServer, redisMissing } from './redis-missing.mjs';

const say = (message) => console.log(`[sample] ${message}`);

function freePort() {
  return new Promise((resolve, reject) => {
    const server = createServer().once('error', reject);
    server.listen(0, '127.0.0.1', () => {
      const { port } = server.address();
      server.close(() => resolve(port));
    });
  });
}

async function privateRedis() {
  const port = await freePort();
  const dir = mkdtempSync(join(tmpdir(), 'nestjs-redis-lock-sample-'));
  const child = spawn(
    'redis-server',
    [
      '--port',
      String(port),
      '--bind',
      '127.0.0.1',
      '--save',
      '',
      '--appendonly',
      'no',
      '--dir',
      dir,
    ],
    {
      stdio: ['ignore', 'pipe', 'inherit'],
    },
  );
  await new Promise((resolve, reject) => {
    child.once('error', (error) =>
      reject(new Error(`cannot start redis-server: ${error.message}`)),
    );
    child.once('exit', (code) => reject(new Error(`redis-server exited with ${code}`)));
    child.stdout.on(
      'data',
      (chunk) => chunk.toString().includes('Ready to accept connections') && resolve(),
    );
  });
  child.stdout.resume();
  const stop = () => {
    child.kill('SIGTERM');
    rmSync(dir, { recursive: true, force: true });
  };
  return { url: `redis://127.0.0.1:${port}`, stop };
}

let redis;
if (process.env.REDIS_URL) {
  say(`using REDIS_URL=${process.env.REDIS_URL}`);
} else if (!hasRedisServer('redis-server')) {
  console.error(`[sample] no REDIS_URL set, and ${redisMissing('npm run sample')}`);
  process.exit(1);
} else {
  redis = await privateRedis();
  process.env.REDIS_URL = redis.url;
  say(
    `no REDIS_URL set: started a private redis-server at ${redis.url}; it stops with the sample (set REDIS_URL to use yours)`,
  );
}

// `nest start` runs the app as its own child: give it a process group of its own and signal the
// whole group, so that stopping this script stops the app too.
const nest = spawn(
  process.execPath,
  ['node_modules/@nestjs/cli/bin/nest.js', 'start', ...process.argv.slice(2)],
  {
    stdio: 'inherit',
    env: process.env,
    detached: true,
  },
);
const stopAll = (signal) => {
  try {
    process.kill(-nest.pid, signal);
  } catch {
    // already gone
  }
};
for (const signal of ['SIGINT', 'SIGTERM', 'SIGHUP']) process.on(signal, () => stopAll(signal));
nest.once('exit', (code, signal) => {
  stopAll('SIGTERM');
  redis?.stop();
  process.exit(code ?? (signal ? 0 : 1));
});
