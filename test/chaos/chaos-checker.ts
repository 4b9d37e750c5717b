/** Turns what a chaos scenario recorded into its figures. Pure: unit-tested on made-up histories. */

/** One critical section, as its worker recorded it (times on the system-wide monotonic clock). */
export interface Section {
  id: string;
  key: string;
  fence: number;
  path: 'using' | 'route';
  enter: number;
  exit?: number;
  /** When its lock's signal aborted (during the section, or after it, e.g. at the release). */
  abortAt?: number;
  reason?: string;
  wrote?: 'accepted' | 'rejected' | 'skipped';
  /** Set when the runner SIGKILLed its worker before it exited. */
  killedAt?: number;
  /** From the call to the section, on the using() path. */
  waited?: number;
  /**
   * The hold it ran in: sections of one hold (re-entered, or forked inside it, taking turns)
   * share its fence, one after another; any other section needs a higher one.
   */
  hold?: string;
  /**
   * A section of an earlier phase of the session whose holder still believed when this phase began
   * (see `runPhases`): an overlap with it, or a fence that is not above its fence, counts in this
   * phase; it does not count as one of this phase's sections.
   */
  context?: boolean;
}

export interface Call {
  path: 'using' | 'route';
  outcome: string;
  /** When it was made. */
  start: number;
  ms: number;
  unsettled: boolean;
  /**
   * The machine was starved during the call: its worker's event loop, or the runner's (which
   * carries every worker's traffic through the fault proxies), stood still for over 250 ms.
   */
  starved: boolean;
}

export interface ScenarioRecord {
  name: string;
  /** Redis loses its state in this scenario (see Scenario.losesState). */
  losesState: boolean;
  runs: number;
  faults: number;
  sections: Section[];
  calls: Call[];
  /** Per resource key, the fences the guard accepted, in the order it accepted them. */
  accepted: Map<string, number[]>;
  /** Writes the guard rejected (fence lower than one it had accepted). */
  rejected: number;
  /** Lock keys still in Redis after every worker exited (and every killed holder's TTL ran out). */
  leftoverLocks: number;
  keysWithoutTtl: number;
  unhandled: number;
  /** Workers that died on their own (not killed by the runner), or did not shut down in bounds. */
  crashes: number;
  unsettledShutdowns: number;
  /** When the scenario ended: a section with neither exit nor kill believed until then. */
  end: number;
}

export interface ScenarioFigures {
  name: string;
  losesState: boolean;
  runs: number;
  faults: number;
  sections: number;
  /**
   * How calls ended: ok; busy (lock not acquired in time: LockAcquireTimeoutError, HTTP 409);
   * failed (a typed lock failure: LockBackendError, LockLostError, or the route's HTTP 500 for
   * them); other (anything else: a bug, must stay 0).
   */
  calls: Record<'ok' | 'busy' | 'failed' | 'other', number>;
  /** Failed calls during which the machine was starved (see `Call.starved`). */
  failedStarved: number;
  /** Sections entered while another holder of the key still believed it held the lock. */
  overlaps: number;
  staleAccepted: number;
  staleRejected: number;
  fenceRegressions: number;
  signals: number;
  /** Holders (not killed) that someone else entered on while they still believed. */
  lost: number;
  /** Of those, how many never saw their signal abort (during the section or at its release). */
  lostUnsignalled: number;
  /** From the first intruder's entry to the lost holder's signal, ms (0 when it came first). */
  signalDelay: { p50: number; p99: number };
  leaks: number;
  noTtl: number;
  unhandled: number;
  crashes: number;
  unsettled: number;
  acquire: { p50: number; p99: number; max: number };
}

/** A record with nothing counted yet. */
export function emptyRecord(name: string, losesState: boolean, runs: number): ScenarioRecord {
  return {
    name,
    losesState,
    runs,
    faults: 0,
    sections: [],
    calls: [],
    accepted: new Map(),
    rejected: 0,
    leftoverLocks: 0,
    keysWithoutTtl: 0,
    unhandled: 0,
    crashes: 0,
    unsettledShutdowns: 0,
    end: 0,
  };
}

/** When a holder stopped believing it held the lock. */
export function beliefEnd(section: Section, end: number): number {
  return Math.min(section.exit ?? section.killedAt ?? end, section.abortAt ?? Infinity);
}

export function check(record: ScenarioRecord): ScenarioFigures {
  const byKey = new Map<string, Section[]>();
  for (const section of record.sections) {
    const list = byKey.get(section.key) ?? [];
    list.push(section);
    byKey.set(section.key, list);
  }

  let overlaps = 0;
  let fenceRegressions = 0;
  const firstIntrusion = new Map<Section, number>();
  for (const sections of byKey.values()) {
    sections.sort((a, b) => a.enter - b.enter);
    let highest = -Infinity;
    let highestHold: string | undefined;
    let believing: Section[] = [];
    for (const section of sections) {
      // Entered with its signal already aborted (paused between the grant and the section, past
      // its lease): it never believed it held the lock and never used its fence.
      if (section.abortAt !== undefined && section.abortAt <= section.enter) continue;
      believing = believing.filter((s) => beliefEnd(s, record.end) > section.enter);
      // A context section's own fence and intrusions were counted in its own phase.
      if (!section.context) {
        const sameHold = section.hold !== undefined && section.hold === highestHold;
        if (section.fence < highest || (section.fence === highest && !sameHold)) {
          fenceRegressions++;
        }
        if (believing.length > 0) overlaps++;
        for (const holder of believing) {
          if (!firstIntrusion.has(holder)) firstIntrusion.set(holder, section.enter);
        }
      }
      if (section.fence >= highest) highestHold = section.hold;
      highest = Math.max(highest, section.fence);
      believing.push(section);
    }
  }

  let lost = 0;
  let lostUnsignalled = 0;
  const delays: number[] = [];
  for (const [holder, intrudedAt] of firstIntrusion) {
    if (holder.killedAt !== undefined) continue;
    lost++;
    if (holder.abortAt === undefined) lostUnsignalled++;
    else delays.push(Math.max(0, holder.abortAt - intrudedAt));
  }

  let staleAccepted = 0;
  for (const fences of record.accepted.values()) {
    let highest = -Infinity;
    for (const fence of fences) {
      if (fence < highest) staleAccepted++;
      highest = Math.max(highest, fence);
    }
  }

  const calls = { ok: 0, busy: 0, failed: 0, other: 0 };
  let failedStarved = 0;
  for (const call of record.calls) {
    const kind = classify(call.outcome);
    calls[kind]++;
    if (kind === 'failed' && call.starved) failedStarved++;
  }
  const own = record.sections.filter((s) => !s.context);
  const waits = own.flatMap((s) => (s.waited === undefined ? [] : [s.waited]));

  return {
    name: record.name,
    losesState: record.losesState,
    runs: record.runs,
    faults: record.faults,
    sections: own.length,
    calls,
    failedStarved,
    overlaps,
    staleAccepted,
    staleRejected: record.rejected,
    fenceRegressions,
    signals: own.filter((s) => s.abortAt !== undefined).length,
    lost,
    lostUnsignalled,
    signalDelay: { p50: percentile(delays, 50), p99: percentile(delays, 99) },
    leaks: record.leftoverLocks,
    noTtl: record.keysWithoutTtl,
    unhandled: record.unhandled,
    crashes: record.crashes,
    unsettled: record.calls.filter((c) => c.unsettled).length + record.unsettledShutdowns,
    acquire: { p50: percentile(waits, 50), p99: percentile(waits, 99), max: Math.max(0, ...waits) },
  };
}

/** What a call ended in (see `ScenarioFigures.calls`). */
function classify(outcome: string): keyof ScenarioFigures['calls'] {
  switch (outcome) {
    case 'ok':
      return 'ok';
    case 'LockAcquireTimeoutError':
    case 'http 409':
      return 'busy';
    case 'LockBackendError':
    case 'LockLostError':
    case 'http 500':
      return 'failed';
    default:
      return 'other';
  }
}

export function percentile(values: readonly number[], p: number): number {
  if (values.length === 0) return 0;
  const sorted = [...values].sort((a, b) => a - b);
  return sorted[Math.min(sorted.length - 1, Math.ceil((p / 100) * sorted.length) - 1)];
}
