import assert from 'node:assert/strict';
import { spawn, type ChildProcess } from 'node:child_process';
import { once } from 'node:events';
import { after, before, describe, it } from 'node:test';
import { fileURLToPath } from 'node:url';
import { eventually } from '../support/lock-module.js';
import { freePort, startRedis, type RedisServer } from '../support/redis-server.js';

const root = fileURLToPath(new URL('../../..', import.meta.url));

describe('npm run sample', () => {
  let server: RedisServer;
  let sample: ChildProcess | undefined;

  before(async () => {
    server = await startRedis();
  });
  after(async () => {
    if (sample && sample.exitCode === null) {
      sample.kill('SIGTERM');
      await once(sample, 'exit');
    }
    await server?.stop();
  });

  it('starts the sample with nest start, serves purchases, and stops with its whole process tree', async () => {
    const port = await freePort();
    sample = spawn(process.execPath, ['scripts/sample.mjs'], {
      cwd: root,
      env: {
        ...process.env,
        REDIS_URL: server.url,
        PORT: String(port),
        MICROSERVICE_PORT: String(await freePort()),
        REPORTS: 'off',
      },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let output = '';
    sample.stdout!.on('data', (chunk: Buffer) => (output += chunk.toString()));
    sample.stderr!.on('data', (chunk: Buffer) => (output += chunk.toString()));
    assert.ok(await eventually(() => output.includes('Inventory on'), 90_000), output);
    assert.match(output, new RegExp(`using REDIS_URL=${server.url}`));

    const url = `http://127.0.0.1:${port}/products`;
    assert.deepEqual(await (await fetch(url)).json(), ['gadget', 'widget']);
    const purchase = await fetch(`${url}/widget/purchase`, { method: 'POST' });
    assert.equal(purchase.status, 201);
    // The README's move: both SKUs locked together.
    const move = await fetch(`${url}/gadget/move`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: '{"to":"widget","quantity":2}',
    });
    assert.equal(move.status, 201);
    assert.deepEqual(((await move.json()) as { remaining: unknown }).remaining, {
      gadget: 8,
      widget: 11,
    });

    sample.kill('SIGTERM');
    await once(sample, 'exit');
    const stillServing = await fetch(url).then(
      () => true,
      () => false,
    );
    assert.equal(stillServing, false, 'the app process stopped with the script');
  });
});
