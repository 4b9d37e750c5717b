/**
 * What the benchmark runner asks of a worker process, and what it gets back. A worker prints
 * `READY` once connected and set up, then waits for a line on its stdin: the runner sends it to
 * every process of a run at once, when all are ready, so that they start together.
 */

export const READY = 'ready';

export type Workload = 'sequential' | 'concurrent' | 'hot' | 'idle' | 'memory';

export interface BenchJob {
  contender: string;
  workload: Workload;
  port: number;
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
  /** Memory workload: heap growth after `pairs` distinct keys, heap and Redis cost per key. */
  memory?: {
    heapGrowthPct: number;
    heapPerHeldLock: number;
    redisBytesPerKey: number;
    keysLeft: number;
  };
}
