import type { Cluster, Redis } from 'ioredis';
import type { Writable } from 'node:stream';

/**
 * Most commands one write carries. Bigger batches save more system calls but leave Redis idle while
 * the client prepares them; measured on loopback (`npm run bench`, workload 2), 16 does best.
 */
const BATCH = 16;

/**
 * Lets the lock commands sent in the same tick share one socket write. Under concurrency (many
 * requests locking at once, many waiters woken by one reply) the client otherwise makes one write
 * system call per command, which is most of what a lock costs the client's CPU.
 *
 * The first command of a tick is written at once, as ioredis would; from the second on, the socket
 * is corked, and uncorked every `BATCH` commands and on `process.nextTick`, before the event loop
 * goes on to I/O, so no command waits for anything but the code already running. Only on a standalone (or Sentinel)
 * connection that is ready; a Cluster routes each command to its own node and is left alone.
 * Like `enableAutoPipelining` in ioredis, but for lock commands only and without a `Pipeline`.
 */
export class WriteBatcher {
  private sentThisTick = false;
  private corked: Writable | undefined;
  private inBatch = 0;

  private constructor(private readonly client: Redis) {}

  static for(client: Redis | Cluster): WriteBatcher | undefined {
    return (client as { isCluster?: boolean }).isCluster
      ? undefined
      : new WriteBatcher(client as Redis);
  }

  /** Call right before sending a lock command. */
  beforeSend(): void {
    if (!this.sentThisTick) {
      this.sentThisTick = true;
      process.nextTick(this.endTick);
      return;
    }
    if (this.corked) {
      if (++this.inBatch === BATCH) {
        this.corked.uncork();
        this.corked.cork();
        this.inBatch = 0;
      }
      return;
    }
    if (this.client.status !== 'ready') return;
    const stream = this.client.stream as Writable | undefined;
    if (!stream?.writable) return;
    stream.cork();
    this.corked = stream;
    this.inBatch = 1;
  }

  private readonly endTick = (): void => {
    this.sentThisTick = false;
    const stream = this.corked;
    this.corked = undefined;
    stream?.uncork();
  };
}
