/**
 * What the benchmark runner asks of a worker process, and what it gets back. A worker prints
 * `READY` once connected and set up, then waits for a line on its stdin: the runner sends it to
 * every process of a run at once, when all are ready, so that they start together.
 */

export const READY = 'ready';

export type Workload = 'sequential' | 'concurrent' | 'hot' | 'idle' | 'memory' | 'waiters' | 'keys';

/**
 * Where a run's Redis is: one server (every workload but the sections below), three independent
 * masters (the Redlock section: Redlock libraries and ours with `nodes`), or a Cluster of three
 * masters (the Cluster section).
 */
export type Topology = 'single' | 'redlock' | 'cluster';

export interface BenchJob {
  contender: string;
  workload: Workload;
  topology: Topology;
  /** The server's port; the Redlock nodes', or the Cluster masters' (the first is `port`). */
  port: number;
  ports: number[];
  /** This process's index among the processes of the run. */
  proc: number;
  pairs: number;
  durationMs: number;
  workers: number;
  thinkMs: number;
}

/** One critical section of the hot-key workload; times on the system-wide monotonic clock, ms. */
export interface SectionRecord {
  worker: string;
  enter: number;
  exit: number;
  /** From asking for the lock to entering the section. */
  wait: number;
}

export interface BenchResult {
  ops: number;
  ms: number;
  cpuMs: number;
  /** Sequential and concurrent workloads: the Redis server's CPU time during the run. */
  redisCpuMs?: number;
  /** Redis commands the lock's connections sent while measuring. */
  commands: number;
  sections?: SectionRecord[];
  failures?: number;
  /** Hot key: how long each acquisition that failed had waited (a failed wait is a wait too). */
  failedWaits?: number[];
  /**
   * Waiters workload: `workers` waiters parked on a held key in one process, then the key
   * released: the commands per second while they were parked, the heap each took, the time from
   * the release until the last of them had held the key (each releases at once), and the share of
   * them granted in the order they asked.
   */
  waiters?: {
    parkedCommandsPerSec: number;
    heapPerWaiter: number;
    drainMs: number;
    inOrderPct: number;
  };
  /**
   * Keys workload: `pairs` distinct keys held at once: the client heap and Redis memory per held
   * lock; then all released: the Redis keys and bytes left per lock.
   */
  keys?: {
    heapPerLock: number;
    redisBytesPerLock: number;
    keysLeftPerLock: number;
    redisBytesLeftPerLock: number;
  };
  /** Memory workload: heap growth after `pairs` distinct keys, heap and Redis cost per key. */
  memory?: {
    heapGrowthPct: number;
    heapPerHeldLock: number;
    redisBytesPerKey: number;
    keysLeft: number;
  };
}
