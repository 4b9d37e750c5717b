import { createServer, Socket, type AddressInfo, type Server } from 'node:net';
import type { Redis } from 'ioredis';

/**
 * A loopback TCP proxy between lock clients and Redis that can misbehave on demand, standing in
 * for the network: added latency, connections dropped (reset), and stalls (a partition: nothing
 * crosses in either direction, the sockets stay open, and what was sent is delivered when it
 * heals, as TCP would after retransmitting).
 */
export class FaultProxy {
  private readonly server: Server;
  private readonly pairs = new Set<[Socket, Socket]>();
  private latencyMs = 0;
  private stalled = false;
  /** Holds only what Redis sends back (see `holdReplies`). */
  private repliesHeld = false;
  /** The client end of every connection: where replies go. */
  private readonly clients = new WeakSet<Socket>();
  /** Whether connections accepted from now on are muted (see `muteNewConnections`). */
  private mutingNew = false;
  /** The client ends of the connections whose replies are held until `heal()`. */
  private readonly muted = new Set<Socket>();
  /** Replaced in every reply (see `rewriteReplies`). */
  private rewrite: { from: Buffer; to: Buffer } | undefined;
  /** Chunks held back while stalled, in order, with the socket each is for. */
  private held: { to: Socket; chunk: Buffer }[] = [];
  /** Chunks waiting out the latency, per destination socket, oldest first. */
  private readonly delayed = new Map<Socket, { at: number; chunk: Buffer }[]>();

  private constructor(private readonly target: () => number) {
    this.server = createServer((client) => this.accept(client));
  }

  /** Starts a proxy on a free 127.0.0.1 port that forwards to the port `target()` names. */
  static async start(target: () => number): Promise<FaultProxy> {
    const proxy = new FaultProxy(target);
    await new Promise<void>((resolve) => proxy.server.listen(0, '127.0.0.1', resolve));
    return proxy;
  }

  get port(): number {
    return (this.server.address() as AddressInfo).port;
  }

  /** Delays every chunk, both ways, by `ms` (0: none). Order is kept. */
  setLatency(ms: number): void {
    this.latencyMs = ms;
  }

  /** A partition: holds every byte until `heal()`. New connections are accepted but stall too. */
  stall(): void {
    this.stalled = true;
    // Bytes still waiting out the latency are older than anything sent from now on.
    for (const [to, queue] of this.delayed) {
      for (const { chunk } of queue.splice(0)) this.held.push({ to, chunk });
    }
    this.delayed.clear();
  }

  /**
   * Holds every reply until `heal()`, while commands still reach Redis and run: a client that
   * waits for its answers while what it asked for is done, for a test to change meanwhile.
   * (Replies already waiting out a latency still go.)
   */
  holdReplies(): void {
    this.repliesHeld = true;
  }

  /**
   * Holds every reply on the connections accepted from now on until `heal()`, while those open
   * already go on as before: a client's connection opened later (a subscriber) that never hears
   * back.
   */
  muteNewConnections(): void {
    this.mutingNew = true;
  }

  /**
   * Replaces `from` with `to` (of the same length, so that RESP's lengths stay right) in every
   * reply from now on: a real Redis that says something else of itself, such as an older
   * `redis_version` in `INFO`. (Within one chunk: a reply cut across two is left as it is.)
   */
  rewriteReplies(from: string, to: string): void {
    if (Buffer.byteLength(from) !== Buffer.byteLength(to)) {
      throw new Error(`rewriteReplies: "${from}" and "${to}" differ in length`);
    }
    this.rewrite = { from: Buffer.from(from), to: Buffer.from(to) };
  }

  heal(): void {
    this.stalled = false;
    this.repliesHeld = false;
    this.mutingNew = false;
    this.muted.clear();
    const held = this.held;
    this.held = [];
    for (const { to, chunk } of held) if (!to.destroyed) to.write(chunk);
  }

  /** Resets every open connection (both sides), as a crashed middlebox would. */
  dropAll(): void {
    for (const [a, b] of this.pairs) {
      reset(a);
      reset(b);
    }
    this.pairs.clear();
    this.held = [];
    this.delayed.clear();
  }

  /**
   * Resets the one connection whose client end is at local port `clientPort` (a client's
   * `stream.localPort`), leaving every other connection through the proxy as it is.
   */
  drop(clientPort: number): void {
    for (const pair of this.pairs) {
      if (pair[0].remotePort !== clientPort) continue;
      this.pairs.delete(pair);
      for (const socket of pair) {
        reset(socket);
        this.delayed.delete(socket);
      }
      return;
    }
    throw new Error(`no connection from port ${clientPort} goes through the proxy`);
  }

  async close(): Promise<void> {
    this.dropAll();
    await new Promise<void>((resolve) => this.server.close(() => resolve()));
  }

  private accept(client: Socket): void {
    const upstream = new Socket();
    const pair: [Socket, Socket] = [client, upstream];
    this.clients.add(client);
    if (this.mutingNew) this.muted.add(client);
    this.pairs.add(pair);
    const end = (): void => {
      this.pairs.delete(pair);
      this.muted.delete(client);
      client.destroy();
      upstream.destroy();
    };
    client.on('error', end).on('close', end);
    upstream.on('error', end).on('close', end);
    upstream.connect(this.target(), '127.0.0.1');
    client.on('data', (chunk: Buffer) => this.forward(upstream, chunk));
    upstream.on('data', (chunk: Buffer) => this.forward(client, chunk));
  }

  private forward(to: Socket, original: Buffer): void {
    const chunk = this.clients.has(to) ? this.rewritten(original) : original;
    if (this.stalled || (this.repliesHeld && this.clients.has(to)) || this.muted.has(to)) {
      this.held.push({ to, chunk });
      return;
    }
    const queue = this.delayed.get(to);
    if (this.latencyMs === 0 && !queue) {
      if (!to.destroyed) to.write(chunk);
      return;
    }
    // One FIFO per socket, drained by one timer: lowering the latency never reorders bytes.
    const entry = { at: performance.now() + this.latencyMs, chunk };
    if (queue) queue.push(entry);
    else {
      const fresh = [entry];
      this.delayed.set(to, fresh);
      this.drainLater(to, fresh);
    }
  }

  private rewritten(chunk: Buffer): Buffer {
    if (!this.rewrite) return chunk;
    const { from, to } = this.rewrite;
    let at = chunk.indexOf(from);
    if (at < 0) return chunk;
    const copy = Buffer.from(chunk);
    for (; at >= 0; at = copy.indexOf(from, at + from.length)) to.copy(copy, at);
    return copy;
  }

  private drainLater(to: Socket, queue: { at: number; chunk: Buffer }[]): void {
    setTimeout(
      () => {
        // stall() and dropAll() take the queue over (or discard it): this timer is then done.
        if (this.delayed.get(to) !== queue) return;
        while (queue.length > 0 && queue[0].at <= performance.now() + 1) {
          const { chunk } = queue.shift()!;
          if (!to.destroyed) to.write(chunk);
        }
        if (queue.length > 0) this.drainLater(to, queue);
        else this.delayed.delete(to);
      },
      Math.max(0, queue[0].at - performance.now()),
    );
  }
}

/**
 * Ends `socket` with a TCP reset, as a crashed middlebox would; one whose peer already ended it
 * (Node then shuts down its side by itself) is only destroyed. libuv forbids a reset after a
 * shutdown, and on Node 20 doing it anyway can leave the process spinning at 100 % CPU with its
 * event loop stopped for good (seen: a test file that never ended after `close()`).
 */
function reset(socket: Socket): void {
  if (socket.destroyed) return;
  if (socket.writableEnded || socket.readableEnded) socket.destroy();
  else socket.resetAndDestroy();
}

/**
 * Makes the Redis behind `proxy` say in `INFO` that it is a 6.x (its major, as `direct`, a
 * client straight to it, reads it, rewritten): a real server, as old as the startup check sees it.
 */
export async function posingAsRedis6(proxy: FaultProxy, direct: Redis): Promise<void> {
  const major = /^redis_version:(\d+)\./m.exec(await direct.info('server'))?.[1];
  if (major === undefined) throw new Error('posingAsRedis6: INFO names no redis_version');
  proxy.rewriteReplies(`redis_version:${major}.`, 'redis_version:6.');
}
