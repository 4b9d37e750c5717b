/** Turns what a chaos scenario recorded into its figures. Pure: unit-tested on made-up histories. */
import type { SectionShape } from './chaos-protocol.js';

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
  /**
   * Its signal aborted while the machine was starved: its worker's or the runner's event loop
   * stood still for over 100 ms from a TTL before the section to the abort (see `Call.starved`).
   */
  starved?: boolean;
  /**
   * When its lease had run out, as its holder knew it (`expiresAt`), read when its signal aborted.
   * A starved holder whose lease ended before another entered ran on only because its process
   * could not run its expiry timer in time (see `ScenarioFigures.overlapsStarved`).
   */
  leaseEnd?: number;
  /**
   * The longest its worker's or the runner's event loop stood still (ms) from a TTL before the
   * section to its abort: a signal due meanwhile fired up to that late.
   */
  stall?: number;
  /**
   * Its signal aborted after the phase it entered in had ended (see `runPhases`): the next
   * phase's fault may have made it fire.
   */
  signalLater?: boolean;
  /** Set when the runner SIGKILLed its worker before it exited. */
  killedAt?: number;
  /** From the call to the section, on the using() path. */
  waited?: number;
  /**
   * The hold it ran in: sections of one hold (re-entered, or forked inside it, taking turns)
   * share its fence, one after another; any other section needs a higher one.
   */
  hold?: string;
  /** Entered this long after its lock's `expiresAt` (its signal had not aborted yet). */
  overdue?: number;
  /**
   * One key of a lock on several keys: its first section is not its grant. The key was granted
   * when the acquisition took it, and the acquisition may then have waited (up to
   * `acquireTimeout`) for another key before any section ran. By then a Redis that forgot its
   * locks (restarted empty) may have granted that key again, with a newer fence: an overlap
   * (counted), not a fence issued out of order.
   */
  multi?: boolean;
  /**
   * What it held: the plain lock (none), a semaphore place with its limit (taken only while
   * fewer than that many hold the key), a read lock (beside other readers) or a write lock.
   */
  shape?: SectionShape;
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
   * carries every worker's traffic through the fault proxies), stood still for over 100 ms.
   */
  starved: boolean;
  /** For a failed call: the error's message and where it was thrown (the route's: the last error logged). */
  detail?: string;
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
  /**
   * What went wrong, one line each (up to 20): every fence regression, overlap and lost holder
   * whose signal never fired, with the sections involved, for the test's failure message.
   */
  notes: string[];
  /**
   * What each call that failed unstarved, or ended in an unexpected error, ended in (see
   * `Call.detail`; up to 20).
   */
  callDetails: string[];
  /** Failed calls during which the machine was starved (see `Call.starved`). */
  failedStarved: number;
  /**
   * Sections entered while another holder of the key still believed it held the lock (not counting
   * `overlapsStarved`).
   */
  overlaps: number;
  /**
   * Sections entered while other holders still believed, every one of them starved past its own
   * lease: the lease had ended before this section entered (the lock kept its promise), and their
   * expiry timers could not run while their process stood still. What fencing is for.
   */
  overlapsStarved: number;
  staleAccepted: number;
  staleRejected: number;
  fenceRegressions: number;
  signals: number;
  /**
   * Of those, the signals no fault of this phase explains away from the lock: they aborted while
   * the machine was starved (see `Section.starved`), or after the phase (`Section.signalLater`).
   */
  signalsExcused: number;
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
  let overlapsStarved = 0;
  let fenceRegressions = 0;
  const notes: string[] = [];
  // Up to 8 of each kind (the words before the colon), so that many overlaps (expected where
  // Redis lost its state) never crowd out a fence regression.
  const kinds = new Map<string, number>();
  const note = (line: string): void => {
    const kind = line.slice(0, line.indexOf(':'));
    const count = kinds.get(kind) ?? 0;
    kinds.set(kind, count + 1);
    if (count < 8) notes.push(line);
  };
  const firstIntrusion = new Map<Section, number>();
  /** The section that intruded first on each of those holders. */
  const intruders = new Map<Section, Section>();
  for (const sections of byKey.values()) {
    sections.sort((a, b) => a.enter - b.enter);
    let highest = -Infinity;
    /** The section that entered with `highest`. */
    let highestBy: Section | undefined;
    /** The highest fence of a plain or write lock: a read lock's must be above it. */
    let highestExclusive = -Infinity;
    const granted = new Set<string>();
    let believing: Section[] = [];
    for (const section of sections) {
      // Entered with its signal already aborted (paused between the grant and the section, past
      // its lease): it never believed it held the lock and never used its fence.
      if (section.abortAt !== undefined && section.abortAt <= section.enter) continue;
      believing = believing.filter((s) => beliefEnd(s, record.end) > section.enter);
      // A hold's first section is its grant, whose fence must be above every fence before it.
      // Its later sections (re-entered, forked, a leader's term running section after section)
      // use the fence it was granted: one that enters after a newer hold's (a holder frozen past
      // its lease runs on before its expiry timer fires) is an overlap, not a fence regression.
      const grant = !section.multi && (section.hold === undefined || !granted.has(section.hold));
      if (section.hold !== undefined) granted.add(section.hold);
      // A context section's own fence and intrusions were counted in its own phase.
      if (!section.context) {
        const floor = fenceFloor(section.shape, highest, highestExclusive);
        if (grant && section.fence <= floor) {
          fenceRegressions++;
          note(
            `fence regression: ${describe(section)} after fence ${floor} (highest: ${highestBy ? describe(highestBy) : '?'})`,
          );
        }
        const conflicting = conflicts(section, believing);
        if (conflicting.length > 0) {
          // Its lease had ended, as its holder knew it, before this one entered, and its process
          // ran its expiry timer late: stood still for over 100 ms, or for at least as long as
          // the signal came after the lease's end (found in CI: 22 ms or more after it, while
          // a loaded machine delayed the worker's timers; no tick over 100 ms).
          const pastLease = (holder: Section): boolean =>
            holder.leaseEnd !== undefined &&
            holder.leaseEnd <= section.enter &&
            (holder.starved === true ||
              (holder.abortAt !== undefined &&
                holder.abortAt - holder.leaseEnd <= (holder.stall ?? 0)));
          if (conflicting.every(pastLease)) overlapsStarved++;
          else {
            overlaps++;
            note(`overlap: ${describe(section)} while ${conflicting.map(describe).join(', ')}`);
          }
        }
        // Only a newer hold intrudes on a holder: a stale one entering is the one that lost.
        for (const holder of conflicting) {
          if (holder.fence < section.fence && !firstIntrusion.has(holder)) {
            firstIntrusion.set(holder, section.enter);
            intruders.set(holder, section);
          }
        }
      }
      if (section.fence > highest) highestBy = section;
      highest = Math.max(highest, section.fence);
      if (typeof section.shape !== 'object' && section.shape !== 'read') {
        highestExclusive = Math.max(highestExclusive, section.fence);
      }
      believing.push(section);
    }
  }

  let lost = 0;
  let lostUnsignalled = 0;
  const delays: number[] = [];
  // A hold has one signal: when it fires in a later section of the hold (a leader's next section,
  // entered by a holder that thawed and finished its section before its overdue timers ran), it
  // tells every section of that hold.
  const holdAborts = new Map<string, number[]>();
  for (const section of record.sections) {
    if (section.hold === undefined || section.abortAt === undefined) continue;
    const key = `${section.key}\0${section.hold}`;
    holdAborts.set(key, [...(holdAborts.get(key) ?? []), section.abortAt]);
  }
  const signalOf = (holder: Section): number | undefined =>
    holder.abortAt ??
    (holder.hold === undefined
      ? undefined
      : holdAborts
          .get(`${holder.key}\0${holder.hold}`)
          ?.filter((at) => at >= holder.enter)
          .sort((a, b) => a - b)[0]);
  for (const [holder, intrudedAt] of firstIntrusion) {
    if (holder.killedAt !== undefined) continue;
    lost++;
    const abortAt = signalOf(holder);
    if (abortAt === undefined) {
      lostUnsignalled++;
      note(
        `lost, never signalled: ${describe(holder)}, intruded at ${intrudedAt.toFixed(0)} by ${describe(intruders.get(holder)!)}`,
      );
    } else delays.push(Math.max(0, abortAt - intrudedAt));
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
  const callDetails: string[] = [];
  for (const call of record.calls) {
    const kind = classify(call.outcome);
    calls[kind]++;
    if (kind === 'failed' && call.starved) failedStarved++;
    else if ((kind === 'failed' || kind === 'other') && callDetails.length < 20) {
      callDetails.push(
        `${call.path} ${call.outcome} at ${call.start.toFixed(0)}, after ${Math.round(call.ms)} ms: ${call.detail ?? '?'}`,
      );
    }
  }
  const own = record.sections.filter((s) => !s.context);
  for (const section of own) {
    if (section.abortAt !== undefined && !section.starved && !section.signalLater) {
      note(`signalled unstarved: ${describe(section)}, at ${section.abortAt.toFixed(0)}`);
    }
  }
  const waits = own.flatMap((s) => (s.waited === undefined ? [] : [s.waited]));

  return {
    name: record.name,
    losesState: record.losesState,
    runs: record.runs,
    faults: record.faults,
    sections: own.length,
    calls,
    failedStarved,
    callDetails,
    notes,
    overlaps,
    overlapsStarved,
    staleAccepted,
    staleRejected: record.rejected,
    fenceRegressions,
    signals: own.filter((s) => s.abortAt !== undefined).length,
    signalsExcused: own.filter((s) => s.abortAt !== undefined && (s.starved || s.signalLater))
      .length,
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

/**
 * The believing holders a section may not enter beside: every one for a plain or write lock, the
 * writers for a read lock; for a semaphore place, those granted before it (a lower fence) once as
 * many as its own limit hold the key (limits differ from caller to caller: each is admitted while
 * fewer than its own hold it), of which the oldest grants are the ones it displaced. A place
 * granted after it answers for itself, by its own limit: a grant whose reply came back late
 * enters after places that were granted beside it by their larger limits.
 */
function conflicts(section: Section, believing: Section[]): Section[] {
  const { shape } = section;
  if (shape === 'read') return believing.filter((s) => s.shape === 'write');
  if (typeof shape !== 'object') return believing;
  const before = believing.filter((s) => s.fence < section.fence);
  if (before.length < shape.limit) return [];
  const oldest = before.sort((a, b) => a.fence - b.fence);
  return oldest.slice(0, before.length - shape.limit + 1);
}

/**
 * The fence a grant must be above: a plain or write lock's, every earlier grant's on the key; a
 * read lock's, every earlier plain or write lock's (readers are granted side by side, and enter in
 * any order); a semaphore place's, none (its places are granted side by side too).
 */
function fenceFloor(shape: SectionShape | undefined, highest: number, exclusive: number): number {
  if (shape === 'read') return exclusive;
  if (typeof shape === 'object') return -Infinity;
  return highest;
}

/** One section in a note: where, which hold and fence, when it believed. */
function describe(s: Section): string {
  const until = s.exit ?? s.killedAt;
  return (
    `${s.key} ${s.path}${describeShape(s.shape)} hold ${s.hold ?? s.id} fence ${s.fence} [${s.enter.toFixed(0)}–${until?.toFixed(0) ?? '…'}` +
    `${s.abortAt === undefined ? '' : `, abort ${s.abortAt.toFixed(0)}`}` +
    `${s.leaseEnd === undefined ? '' : `, lease end ${s.leaseEnd.toFixed(0)}`}` +
    `${s.stall === undefined ? '' : `, longest tick ${s.stall.toFixed(0)} ms`}` +
    `${s.overdue === undefined ? '' : `, entered ${s.overdue.toFixed(0)} ms overdue`}]`
  );
}

function describeShape(shape: SectionShape | undefined): string {
  if (shape === undefined) return '';
  return typeof shape === 'object' ? ` place of ${shape.limit}` : ` ${shape}`;
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
    case 'http 503': // the route's lock could not reach Redis
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
