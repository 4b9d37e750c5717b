/**
 * Runs chaos scenarios: a lock Redis (behind one fault proxy per worker), a healthy Redis for the
 * fence-guarded resource, and worker processes hammering a few hot keys while a fault is injected
 * over and over. Then heals everything, lets killed holders' TTLs run out, stops the workers
 * gracefully and collects what they recorded and what Redis still holds.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';
import { Redis } from 'ioredis';
import { startRedis } from '../support/redis-server.js';
import { LEADER_KEY, stallRecorder, type ChaosEvent, type WorkerConfig } from './chaos-protocol.js';
import {
  beliefEnd,
  emptyRecord,
  type Call,
  type ScenarioRecord,
  type Section,
} from './chaos-checker.js';
import { MODE_LABELS, startTopology, type ChaosMode, type WorkerLink } from './chaos-topologies.js';

export type { ChaosMode } from './chaos-topologies.js';

export interface ChaosProfile {
  name: string;
  workers: number;
  loops: number;
  keys: number;
  ttl: number;
  acquireTimeout: number;
  /** How long faults are injected, per run (per phase, in a session of phases). */
  windowMs: number;
  runs: number;
  /**
   * One session of worker processes per deployment that goes through every scenario in turn, one
   * phase each (see `runPhases`), instead of fresh workers and servers for every scenario.
   */
  phased: boolean;
}

export const PROFILES: Record<'short' | 'full', ChaosProfile> = {
  short: {
    name: 'short',
    workers: 4,
    loops: 8,
    keys: 3,
    ttl: 1_000,
    acquireTimeout: 1_500,
    windowMs: 1_000,
    runs: 1,
    phased: true,
  },
  full: {
    name: 'full',
    workers: 4,
    loops: 8,
    keys: 3,
    ttl: 1_000,
    acquireTimeout: 1_500,
    windowMs: 30_000,
    runs: 2,
    phased: false,
  },
};

/** The lock module's commandTimeout in the workers (the sample does not set it: the default). */
const COMMAND_TIMEOUT = 1_000;
/**
 * A call failed starved when its worker's or the runner's event loop stood still for longer than
 * this: a lease of the short TTL (500 ms) is extended every 167 ms and must be confirmed within
 * the 326 ms after, so a loop that stands still for a fifth of a second on a loaded machine can
 * lose it without any fault (seen in CI: four locks of one worker lost at once after a 192 ms
 * tick, no fault injected).
 */
const STARVED_TICK_MS = 100;

/**
 * How long a waiting writer's mark on read locks outlives its last attempt in the workers:
 * 2 × (retryInterval + retryJitter + commandTimeout), the module's defaults.
 */
const WRITER_MARK_MS = 2 * (1_000 + 50 + COMMAND_TIMEOUT);
const now = (): number => Number(process.hrtime.bigint()) / 1e6;
const sleep = (ms: number): Promise<void> => new Promise((resolve) => setTimeout(resolve, ms));
const between = (min: number, max: number): number => min + Math.random() * (max - min);
const workerScript = fileURLToPath(new URL('./chaos-worker.js', import.meta.url));

/** What a scenario's fault injector can do. */
export interface FaultContext {
  readonly ttl: number;
  /** Each worker's link to the lock servers (its fault proxies), by slot. */
  readonly proxies: readonly WorkerLink[];
  /** Slots whose worker is inside a critical section right now. */
  holders(): number[];
  killWorker(slot: number): Promise<void>;
  pauseWorker(slot: number, ms: number): Promise<void>;
  /** Freezes the lock Redis (Redlock: one node of three; Cluster, Sentinel: a master) for `ms`. */
  pauseRedis(ms: number): Promise<void>;
  /**
   * Kills the lock Redis (Redlock: one node of three) and starts it empty after `downMs`; on
   * Cluster and Sentinel a master, which is failed over and comes back as a replica.
   */
  restartRedis(downMs: number): Promise<void>;
  /** True until the fault window closes. */
  active(): boolean;
}

export interface Scenario {
  name: string;
  /**
   * Redis loses its state (a restart without persistence): a holder may lose its lock to another
   * before it can hear of it, so an unsignalled loss is a figure here, not a violation.
   */
  losesState?: boolean;
  /**
   * Two holders may believe at once here: a holder frozen past its TTL, or a Redis that forgot
   * its locks. Everywhere else (a live holder cut off, latency, resets, a paused Redis, kills) the
   * lease must prevent any overlap.
   */
  overlapPossible?: boolean;
  /** The control run: no fault, so nothing may fail and no signal may fire. */
  control?: boolean;
  /** Injects faults until `ctx.active()` turns false; returns how many it injected. */
  inject(ctx: FaultContext): Promise<number>;
}

/** Repeats `fault` with pauses in between until the window closes. */
async function repeat(
  ctx: FaultContext,
  fault: () => Promise<boolean>,
  gap: [number, number],
): Promise<number> {
  let count = 0;
  while (ctx.active()) {
    if (await fault()) count++;
    await sleep(between(...gap));
  }
  return count;
}

/** Repeats `fault` on the worker of a random current lock holder (skipping moments with none). */
function onHolders(
  ctx: FaultContext,
  fault: (slot: number) => Promise<void>,
  gap: [number, number],
): Promise<number> {
  return repeat(
    ctx,
    async () => {
      const holders = ctx.holders();
      if (holders.length === 0) return false;
      await fault(holders[Math.floor(Math.random() * holders.length)]);
      return true;
    },
    gap,
  );
}

export const SCENARIOS: Scenario[] = [
  {
    name: 'no fault (control)',
    control: true,
    inject: async (ctx) => repeat(ctx, async () => false, [200, 200]),
  },
  {
    name: 'holder killed (SIGKILL)',
    inject: (ctx) => onHolders(ctx, (slot) => ctx.killWorker(slot), [400, 900]),
  },
  {
    name: 'holder paused beyond its TTL (SIGSTOP)',
    overlapPossible: true,
    inject: (ctx) =>
      onHolders(ctx, (slot) => ctx.pauseWorker(slot, between(1.5, 2.5) * ctx.ttl), [200, 600]),
  },
  {
    name: 'holder partitioned beyond its TTL',
    inject: (ctx) =>
      onHolders(
        ctx,
        async (slot) => {
          ctx.proxies[slot].stall();
          await sleep(between(1.5, 2.5) * ctx.ttl);
          ctx.proxies[slot].heal();
        },
        [200, 600],
      ),
  },
  {
    name: 'network latency 50-250 ms',
    inject: (ctx) =>
      repeat(ctx, async () => {
        const latency = between(50, 250);
        for (const proxy of ctx.proxies) proxy.setLatency(latency);
        await sleep(between(1_000, 2_000));
        for (const proxy of ctx.proxies) proxy.setLatency(0);
        return true;
      }, [300, 700]),
  },
  {
    name: 'connections reset',
    inject: (ctx) =>
      repeat(ctx, async () => {
        ctx.proxies[Math.floor(Math.random() * ctx.proxies.length)].dropAll();
        return true;
      }, [150, 500]),
  },
  {
    name: 'Redis paused beyond the TTL (SIGSTOP)',
    inject: (ctx) =>
      repeat(ctx, async () => {
        await ctx.pauseRedis(between(1.5, 2) * ctx.ttl);
        return true;
      }, [800, 1_500]),
  },
  {
    name: 'Redis killed, restarted empty',
    losesState: true,
    overlapPossible: true,
    inject: (ctx) =>
      repeat(ctx, async () => {
        await ctx.restartRedis(between(200, 800));
        return true;
      }, [1_000, 2_000]),
  },
];

interface Worker {
  slot: number;
  child: ChildProcess;
  killed: boolean;
  /** When the runner SIGKILLed it: sections whose lines arrive later ended then at the latest. */
  killedAt?: number;
  exited: Promise<number | null>;
  ready: Promise<void>;
  open: Set<Section>;
  summary?: Extract<ChaosEvent, { t: 'summary' }>;
}

/** One scenario's stretch of a session: its faults from `start`, and the settling after them. */
interface Phase {
  scenario: Scenario;
  start: number;
  end: number;
  faults: number;
}

/** Everything a session recorded, and its phases. */
interface Session {
  record: ScenarioRecord;
  phases: Phase[];
  /** When each unhandled rejection and each crash was reported. */
  unhandledAt: number[];
  crashAt: number[];
}

/**
 * The order of a session's phases: where two holders may overlap (a frozen holder, a Redis that
 * forgot its locks) last, so that a holder still running on from one of those phases can only meet
 * a later holder in a phase where that is possible too; the restart, which changes a Cluster's or
 * Sentinel's masters, at the very end.
 */
export const PHASE_ORDER: readonly Scenario[] = [
  ...SCENARIOS.filter((scenario) => !scenario.overlapPossible),
  ...SCENARIOS.filter((scenario) => scenario.overlapPossible && !scenario.losesState),
  ...SCENARIOS.filter((scenario) => scenario.losesState),
];

/** Runs one scenario `profile.runs` times, each with fresh servers and workers, and returns everything it recorded. */
export async function runScenario(
  scenario: Scenario,
  profile: ChaosProfile,
  mode: ChaosMode = 'standalone',
): Promise<ScenarioRecord> {
  const name = MODE_LABELS[mode] ? `${MODE_LABELS[mode]}: ${scenario.name}` : scenario.name;
  const record = emptyRecord(name, scenario.losesState ?? false, profile.runs);
  for (let run = 0; run < profile.runs; run++) {
    // Heal, then give killed or cut-off holders' locks time to expire before the final count.
    const session = await runSession([scenario], profile, mode, run, profile.ttl + 1_500);
    const { sections, calls, accepted, ...counts } = session.record;
    record.faults += session.phases[0].faults;
    record.sections.push(...sections);
    record.calls.push(...calls);
    for (const [key, fences] of accepted) record.accepted.set(key, fences);
    record.rejected += counts.rejected;
    record.leftoverLocks += counts.leftoverLocks;
    record.keysWithoutTtl += counts.keysWithoutTtl;
    record.unhandled += counts.unhandled;
    record.crashes += counts.crashes;
    record.unsettledShutdowns += counts.unsettledShutdowns;
    record.end = counts.end;
  }
  return record;
}

/**
 * Every scenario in turn (`PHASE_ORDER`) on one deployment, with one set of worker processes: a
 * phase injects its faults for `windowMs`, then heals and lets the workers settle a moment.
 * Returns one record per scenario,
 * holding what happened in its phase: the sections entered and the calls started in it, with the
 * sections of earlier phases whose holders still believed when it began (`context`: an overlap with
 * one of those counts here), and one record of the whole session, which alone counts what only the
 * end shows (locks left, keys without TTL, writes the fence guard accepted out of order, workers
 * that did not shut down in time).
 */
export async function runPhases(
  profile: ChaosProfile,
  mode: ChaosMode = 'standalone',
): Promise<{ phases: ScenarioRecord[]; session: ScenarioRecord }> {
  const { record, phases, unhandledAt, crashAt } = await runSession(
    PHASE_ORDER,
    profile,
    mode,
    0,
    // Enough for a healed link's queued commands to arrive. A holder that lost its lock while
    // frozen or cut off has seen its lease end already; one that runs on a moment after it thaws
    // can only meet the next phase's holders in the last two phases, where that is allowed.
    300,
  );
  const label = MODE_LABELS[mode] ? `${MODE_LABELS[mode]}: ` : '';
  const records = phases.map((phase, i) => {
    const from = i === 0 ? -Infinity : phase.start;
    const within = (at: number): boolean => at >= from && at < phase.end;
    const phaseRecord = emptyRecord(
      `${label}${phase.scenario.name}`,
      phase.scenario.losesState ?? false,
      1,
    );
    phaseRecord.faults = phase.faults;
    phaseRecord.end = record.end;
    // A signal that fired after the phase ended belongs to the phase that made it fire.
    phaseRecord.sections = record.sections.flatMap((section) =>
      within(section.enter)
        ? [
            section.abortAt !== undefined && section.abortAt >= phase.end
              ? { ...section, signalLater: true }
              : section,
          ]
        : section.enter < from && beliefEnd(section, record.end) > from
          ? [{ ...section, context: true }]
          : [],
    );
    // A call counts where it ended: one made near a phase's end may meet the next phase's fault
    // (a control call's last attempt sent into a partition of its worker), and how it ends is
    // that fault's doing.
    phaseRecord.calls = record.calls.filter((call) => within(call.start + call.ms));
    phaseRecord.unhandled = unhandledAt.filter(within).length;
    phaseRecord.crashes = crashAt.filter(within).length;
    return phaseRecord;
  });
  record.name = `${label}the whole session (every phase, then shutdown)`;
  record.losesState = PHASE_ORDER.some((scenario) => scenario.losesState);
  return { phases: records, session: record };
}

/**
 * Starts `mode`'s servers, a healthy Redis for the fence-guarded resource and `profile.workers`
 * worker processes; runs each scenario in turn for `profile.windowMs`, healing and waiting
 * `settleMs` after each; then stops the workers gracefully and collects what they recorded and what
 * Redis still holds.
 */
async function runSession(
  scenarios: readonly Scenario[],
  profile: ChaosProfile,
  mode: ChaosMode,
  run: number,
  settleMs: number | ((scenario: Scenario) => number),
): Promise<Session> {
  const keys = Array.from({ length: profile.keys }, (_, i) => `hot${run}-${i}`);
  const record = emptyRecord(MODE_LABELS[mode], false, 1);
  const session: Session = { record, phases: [], unhandledAt: [], crashAt: [] };
  // The sample's lock keys: prefix 'sample:lock:', the purchase key 'sku:<sku>' in a hash tag.
  const topology = await startTopology(
    mode,
    profile.workers,
    keys.flatMap((key) => ['sku', 'sem', 'rw'].map((kind) => `sample:lock:{${kind}:${key}}`)),
  );
  const links = topology.links;
  const db = await startRedis();
  const sections = new Map<string, Section>();
  const workers: Worker[] = [];
  const longWorkMs: [number, number] = [0.5 * profile.ttl, 1.5 * profile.ttl];
  const callBoundMs =
    profile.acquireTimeout + COMMAND_TIMEOUT + longWorkMs[1] + COMMAND_TIMEOUT + 1_000;
  // The workers' traffic runs through the fault proxies in this process: when its event loop
  // stands still, so does every lock's link to Redis (see Call.starved).
  const stalls = stallRecorder();
  /**
   * Whether the worker's (`worstTick`) or this process's event loop stood still while a lease ran;
   * records on the section how long at most (`Section.stall`).
   */
  const starvedLease = (section: Section, abortAt: number, worstTick: number): boolean => {
    section.stall = Math.max(worstTick, stalls.worst(section.enter - profile.ttl, abortAt));
    return stalls.overlap(section.enter - profile.ttl, abortAt) || section.stall > STARVED_TICK_MS;
  };

  const spawnWorker = (slot: number): Worker => {
    const config: WorkerConfig = {
      slot,
      lock: topology.workerLock(slot),
      dbPort: db.port,
      keys,
      loops: profile.loops,
      ttl: profile.ttl,
      acquireTimeout: profile.acquireTimeout,
      workMs: [1, 10],
      longWorkMs,
      longWorkRatio: 0.05,
      routeRatio: 0.5,
      // Redlock mode takes plain locks only (semaphores and read locks are refused with `nodes`).
      shapeRatio: topology.workerLock(slot).mode === 'redlock' ? 0 : 0.3,
      thinkMs: 5,
      callBoundMs,
    };
    const child = spawn(process.execPath, [workerScript, JSON.stringify(config)], {
      stdio: ['pipe', 'pipe', 'inherit'],
    });
    child.stdin.on('error', () => {}); // a worker that died before its go
    let markReady!: () => void;
    const worker: Worker = {
      slot,
      child,
      killed: false,
      open: new Set(),
      ready: new Promise<void>((resolve) => (markReady = resolve)),
      exited: new Promise((resolve) => child.once('exit', (code) => resolve(code))),
    };
    void worker.exited.then(() => markReady()); // a worker that dies while starting is a crash, not a hang
    createInterface({ input: child.stdout }).on('line', (line) => {
      let event: ChaosEvent;
      try {
        event = JSON.parse(line) as ChaosEvent;
      } catch {
        return; // not ours (a library warning printed to stdout)
      }
      switch (event.t) {
        case 'ready':
          markReady();
          break;
        case 'enter': {
          const section: Section = {
            id: event.id,
            key: event.key,
            fence: event.fence,
            path: event.path,
            enter: event.at,
            waited: event.waited,
            hold: event.hold,
            overdue: event.overdue,
            shape: event.shape,
            multi: event.multi,
            killedAt: worker.killedAt,
          };
          sections.set(event.id, section);
          record.sections.push(section);
          worker.open.add(section);
          break;
        }
        case 'exit': {
          const section = sections.get(event.id);
          if (!section) break;
          Object.assign(section, {
            exit: event.at,
            abortAt: event.abortAt,
            leaseEnd: event.leaseEnd,
            reason: event.reason,
            wrote: event.wrote,
          });
          if (event.abortAt !== undefined) {
            section.starved = starvedLease(section, event.abortAt, event.worstTick ?? 0);
          }
          delete section.killedAt; // it left before the kill: the exit line was still in the pipe
          worker.open.delete(section);
          break;
        }
        case 'call': {
          const call: Call = {
            path: event.path,
            outcome: event.outcome,
            start: event.start,
            ms: event.ms,
            unsettled: event.unsettled,
            starved:
              event.stalled ||
              stalls.overlap(event.start, event.start + event.ms) ||
              Math.max(event.worstTick, stalls.worst(event.start, event.start + event.ms)) >
                STARVED_TICK_MS,
            detail:
              event.detail &&
              `${event.detail} (runner's: ${stalls.worst(event.start, event.start + event.ms).toFixed(0)} ms)`,
          };
          record.calls.push(call);
          break;
        }
        case 'signal': {
          const section = sections.get(event.id);
          if (section && section.abortAt === undefined) {
            section.abortAt = event.at;
            section.leaseEnd = event.leaseEnd;
            section.starved = starvedLease(section, event.at, event.worstTick);
          }
          break;
        }
        case 'unhandled':
          record.unhandled++;
          session.unhandledAt.push(now());
          // The count fails the scenario; the stack says where to look.
          console.error(`chaos ${record.name}: unhandled rejection in a worker: ${event.error}`);
          break;
        case 'summary':
          worker.summary = event;
          break;
      }
    });
    void worker.exited.then((code) => {
      if (worker.killed || code === 0) return;
      record.crashes++;
      session.crashAt.push(now());
    });
    workers[slot] = worker;
    return worker;
  };

  /** Lets a worker that is ready start its calls (see the worker's `go`). */
  const go = (worker: Worker): void => void worker.child.stdin!.end('go\n');

  let windowEnds = Infinity;
  let lastKill = 0;
  const ctx: FaultContext = {
    ttl: profile.ttl,
    proxies: links,
    holders: () => workers.filter((w) => !w.killed && w.open.size > 0).map((w) => w.slot),
    killWorker: async (slot) => {
      const worker = workers[slot];
      worker.killed = true;
      worker.child.kill('SIGKILL');
      worker.killedAt = lastKill = now();
      for (const section of worker.open) section.killedAt = worker.killedAt;
      await worker.exited;
      const next = spawnWorker(slot);
      await next.ready;
      go(next);
    },
    pauseWorker: async (slot, ms) => {
      const child = workers[slot].child;
      child.kill('SIGSTOP');
      await sleep(ms);
      child.kill('SIGCONT');
    },
    pauseRedis: (ms) => topology.pauseRedis(ms),
    restartRedis: (downMs) => topology.restartRedis(downMs),
    active: () => now() < windowEnds,
  };

  try {
    for (let slot = 0; slot < profile.workers; slot++) spawnWorker(slot);
    await Promise.all(workers.map((w) => w.ready));
    workers.forEach(go);
    await sleep(500);
    for (const scenario of scenarios) {
      const start = now();
      windowEnds = start + profile.windowMs;
      const faults = await scenario.inject(ctx);
      for (const link of links) {
        link.setLatency(0);
        link.heal();
      }
      await sleep(typeof settleMs === 'number' ? settleMs : settleMs(scenario));
      session.phases.push({ scenario, start, end: now(), faults });
    }

    const shutdownBound = callBoundMs + 2 * COMMAND_TIMEOUT + 3_000;
    const live = workers.filter((w) => !w.killed);
    for (const worker of live) worker.child.kill('SIGTERM');
    await Promise.all(
      live.map(async (worker) => {
        const timer = setTimeout(() => {
          record.unsettledShutdowns++;
          worker.killed = true;
          worker.child.kill('SIGKILL');
        }, shutdownBound);
        await worker.exited;
        clearTimeout(timer);
      }),
    );
    record.end = now();
    // The locks of killed holders expire within a TTL of their last write, a killed writer's mark
    // on read locks within its stay.
    await sleep(lastKill + Math.max(profile.ttl, WRITER_MARK_MS) + 200 - now());

    const leftovers = await topology.leftovers();
    record.leftoverLocks += leftovers.locks;
    record.keysWithoutTtl += leftovers.keysWithoutTtl;
    const resource = new Redis(db.port, '127.0.0.1');
    const guarded = keys.flatMap((key) => [`sku:${key}`, `rw:${key}`]);
    for (const name of [...guarded, LEADER_KEY]) {
      const fences = await resource.lrange(`resource:${name}:accepted`, 0, -1);
      record.accepted.set(`${run}:${name}`, fences.map(Number));
      record.rejected += Number((await resource.hget(`resource:${name}`, 'rejected')) ?? 0);
    }
    resource.disconnect();
  } finally {
    stalls.stop();
    for (const worker of workers) if (worker.child.exitCode === null) worker.child.kill('SIGKILL');
    await Promise.all(workers.map((w) => w.exited));
    await topology.stop();
    await db.stop();
  }
  return session;
}
