import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import { Controller, Param, Sse, type INestApplication, type MessageEvent } from '@nestjs/common';
import { Redis } from 'ioredis';
import { interval, map, Observable, take } from 'rxjs';
import { WithLock, type LockService } from '../../lib/index.js';
import { eventually, LogCapture, startHttpApp, uniqueKey } from '../support/lock-module.js';
import { startRedis, type RedisServer } from '../support/redis-server.js';

let redis: Redis;
/** Per id of the async route: whether its key was held in Redis as each event went out. */
const heldAtEvent = new Map<string, Promise<number>[]>();

@Controller('streams')
class StreamsController {
  /** An async SSE handler: Nest accepts a Promise of the Observable. */
  @Sse('async/:id')
  @WithLock({ key: 'sse:{0}' })
  async asyncStream(@Param('id') id: string): Promise<Observable<MessageEvent>> {
    await new Promise((resolve) => setTimeout(resolve, 5));
    const checks: Promise<number>[] = [];
    heldAtEvent.set(id, checks);
    return interval(20).pipe(
      take(3),
      map((step) => {
        checks.push(redis.exists(`lock:{sse:${id}}`));
        return { data: { step, id } };
      }),
    );
  }

  /** A stream that never ends and whose teardown throws. */
  @Sse('teardown/:id')
  @WithLock({ key: 'teardown:{0}', ttl: 30_000 })
  throwingTeardown(@Param('id') _id: string): Observable<MessageEvent> {
    return new Observable<MessageEvent>((subscriber) => {
      subscriber.next({ data: 'first' });
      return () => {
        throw new Error('teardown failed');
      };
    });
  }

  @Sse('busy/:id')
  @WithLock({ key: 'busy:{0}', acquireTimeout: 500 })
  busy(@Param('id') id: string): Observable<MessageEvent> {
    return interval(10).pipe(
      take(1),
      map(() => ({ data: id })),
    );
  }
}

/** Reads an SSE response until it ends, or until `until` says enough; returns the raw text. */
async function readEvents(
  url: string,
  until: (text: string) => boolean = () => false,
): Promise<{ status: number; text: string }> {
  const controller = new AbortController();
  const response = await fetch(url, { signal: controller.signal });
  const reader = response.body!.getReader();
  const decoder = new TextDecoder();
  let text = '';
  for (;;) {
    const { done, value } = await reader.read();
    if (done) break;
    text += decoder.decode(value, { stream: true });
    if (until(text)) {
      controller.abort();
      await reader.cancel().catch(() => {});
      break;
    }
  }
  return { status: response.status, text };
}

/** `@WithLock` on SSE handlers: async handlers, teardowns that throw, a timeout mid-stream. */
describe('@WithLock on SSE streams', () => {
  let server: RedisServer;
  let app: INestApplication;
  let base: string;
  let locks: LockService;
  const logs = new LogCapture();

  before(async () => {
    server = await startRedis();
    redis = new Redis(server.port, '127.0.0.1');
    let url: string;
    ({ app, locks, url } = await startHttpApp(
      { connection: server.url },
      { controllers: [StreamsController] },
      logs,
    ));
    base = `${url}/streams`;
  });

  after(async () => {
    await app?.close();
    redis?.disconnect();
    await server?.stop();
  });

  it('an async @Sse() handler streams every event, holding its lock until the stream completes', async () => {
    const id = uniqueKey('s');
    const key = `lock:{sse:${id}}`;
    const { status, text } = await readEvents(`${base}/async/${id}`);
    assert.equal(status, 200);
    const events = [...text.matchAll(/^data: (.*)$/gm)].map((match) => JSON.parse(match[1]));
    assert.deepEqual(
      events.map((event: { step: number }) => event.step),
      [0, 1, 2],
      `every event, one by one: ${text}`,
    );
    // Asked as the first two events went out (the third goes out just before the release).
    const held = await Promise.all(heldAtEvent.get(id)!.slice(0, 2));
    assert.deepEqual(held, [1, 1], 'the lock was held while the events came');
    assert.ok(await eventually(async () => (await redis.exists(key)) === 0), 'released after');
  });

  it('a stream whose teardown throws still releases its lock when the client leaves', async () => {
    const id = uniqueKey('t');
    const key = `lock:{teardown:${id}}`;
    const { text } = await readEvents(`${base}/teardown/${id}`, (sofar) => sofar.includes('first'));
    assert.match(text, /data: first/);
    assert.ok(
      await eventually(async () => (await redis.exists(key)) === 0, 10_000),
      'the key stayed held after the client left',
    );
  });

  it('a lock timeout after the stream started is sent as its error event, without touching the sent headers', async () => {
    const id = uniqueKey('b');
    const held = await locks.acquire(`busy:${id}`, { ttl: 10_000 });
    try {
      const { status, text } = await readEvents(`${base}/busy/${id}`);
      assert.equal(status, 200, 'the stream had started');
      assert.match(text, /event: error\n(id: \d+\n)?data: The resource is busy/, text);
      const headersSent = logs.lines.filter((line) =>
        line.message.includes('ERR_HTTP_HEADERS_SENT'),
      );
      assert.deepEqual(headersSent, []);
    } finally {
      await held.release();
    }
  });
});
