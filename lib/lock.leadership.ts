import type { Logger } from '@nestjs/common';
import { Subject, type Observable } from 'rxjs';
import { randomBytes } from 'node:crypto';
import { hostname } from 'node:os';
import { setTimeout as sleep } from 'node:timers/promises';
import {
  LeaderElectionTimeoutError,
  LeadershipStoppedError,
  LockAcquireAbortedError,
  LockAcquireTimeoutError,
  LockArgumentError,
  LockLostError,
  RedisLockShutdownError,
  type KeyView,
} from './errors/redis-lock.errors.js';
import type { AcquireOptions, Lock } from './interfaces/lock.interface.js';
import type { LockEvents } from './engine/lock.events.js';
import { inChainOf, outsideLocks } from './engine/lock.context.js';
import { ignoreDeadline, within } from './utils/within.js';
import {
  electedOptionsProblem,
  leadOptionsProblem,
  LOSS_REPORTED,
  NOT_COUNTED,
} from './options/acquire-options.js';
import { OutageLog } from './utils/outage-log.js';

/** One term of a leadership: what `work` gets while this instance leads. */
export interface LeaderTerm {
  /** The leadership's key, without the module's `keyPrefix`. */
  readonly key: string;
  /** The id of the participant that leads in this term: this one's (see `LeadOptions.id`). */
  readonly id: string;
  /**
   * The term number: the lock's fence, greater than every earlier leader's. Send it with every
   * write the leader makes and have the resource reject one lower than the highest it has seen.
   */
  readonly fence: number;
  /**
   * Aborts the moment this term ends or may have ended: the lock was lost or could not be
   * confirmed (`LockLostError`), or `stop()` / shutdown gave it up (`LeadershipStoppedError`).
   */
  readonly signal: AbortSignal;
}

/**
 * Who leads a leadership's key, as Redis records it for anyone to read (`LockService.leader()`,
 * `Leadership.leader()`). Times are Redis's clock.
 */
export interface LeaderInfo {
  /** The leading participant's id (see `LeadOptions.id`). */
  readonly id: string;
  /** Its term's fence (`LeaderTerm.fence`). */
  readonly fence: number;
  /** When its term began. */
  readonly since: Date;
  /**
   * When its lease was last extended (its watchdog extends it every third of its TTL), never
   * before `since`: a term's first lease is the grant's, set just before its term began.
   */
  readonly renewedAt: Date;
  /**
   * How many terms began since the election's record was created, this one included. The record
   * is kept for an hour after the last term began or the last participant campaigned.
   */
  readonly transitions: number;
}

/** A campaign for leadership started by `LockService.lead()` or a `@WhileLeader` method. */
export interface Leadership {
  /** The key campaigned for, without the module's `keyPrefix`. */
  readonly key: string;
  /** This participant's id (see `LeadOptions.id`). */
  readonly id: string;
  /** Whether this instance leads now: from the term's start until its `signal` aborts or its work settles. */
  readonly isLeader: boolean;
  /** `true` when this instance becomes leader, `false` when it ceases to be; completes after `stop()`. */
  readonly changes: Observable<boolean>;
  /**
   * Stops campaigning: aborts the current term's `signal`, waits for its work to settle, releases
   * the lock at once (the next leader does not wait for the TTL) and resolves. Idempotent.
   *
   * Called from the term's own work (a leader that steps down on its own: an error it cannot
   * handle, a drain), it does not wait for that work, which is what is calling it: it aborts the
   * term's `signal`, releases the lock and resolves, while the work runs on to its end, no longer
   * leading (its fence is what refuses its writes once another instance leads).
   */
  stop(): Promise<void>;
  /**
   * Resolves with the term when this instance leads: at once if it leads now, else when its next
   * term starts (the term's `signal` not aborted at that moment). The campaign is not changed by
   * it: a timeout or an abort ends only this wait.
   * @throws LeaderElectionTimeoutError when `timeout` ms pass first (the campaign goes on)
   * @throws LockAcquireAbortedError when `signal` aborts first
   * @throws LeadershipStoppedError once `stop()` or the shutdown ended the campaign
   * @throws LockArgumentError for a bad option
   */
  elected(options?: ElectedOptions): Promise<LeaderTerm>;
  /**
   * Who leads this key now, whichever instance it is (`LockService.leader()`).
   * @throws LockBackendError when Redis does not answer within `commandTimeout`
   */
  leader(): Promise<LeaderInfo | null>;
}

/** Options of `Leadership.elected()`. */
export interface ElectedOptions {
  /** How long to wait (ms, ≥ 0; 0 answers only whether it leads now). @default no limit */
  timeout?: number;
  /** Ends the wait (`LockAcquireAbortedError`). */
  signal?: AbortSignal;
}

/** Options of `LockService.lead()` and `@WhileLeader`. */
export interface LeadOptions {
  /**
   * The leader lock's TTL (ms), extended while the leader works: how long after this instance
   * dies or freezes another can take over.
   * @default 10_000 (or the module's `defaults.ttl`)
   */
  ttl?: number;
  /**
   * This participant's id, carried by its terms (`LeaderTerm.id`) and its `elected` / `deposed`
   * events: a non-empty string of at most 200 characters, such as a pod name.
   * @default one per `LockService`: the host name, the process id and a random part
   */
  id?: string;
}

/** What a campaign needs of the lock engine. */
export interface TermRunner {
  /** Takes the lock and runs a term: `LockService.using()`. */
  run(key: string, term: (lock: Lock) => Promise<void>, options: AcquireOptions): Promise<void>;
  /**
   * Settles once no attempt this process gave up on (a campaign's, stopped while its attempt was
   * on its way) may still hold `key`: its late grant undone, within a bound.
   */
  undone(key: string): Promise<void>;
  /** Whether Redis answers for `key` (a read that changes nothing): `LockService.isLocked()`. */
  probe(key: string): Promise<unknown>;
  /** Records that a term of `lock`'s key began, led by `id` (see `LockEngine.recordTerm`). */
  recordTerm(lock: Lock, id: string, ttl: number): Promise<void>;
  /** A campaign's `entry` stays among `key`'s participants `stay` more ms (0: it stopped). */
  participate(key: string, entry: string, stay: number): Promise<void>;
  /** Who leads `key`: `LockService.leader()`. */
  leader(key: string): Promise<LeaderInfo | null>;
}

/**
 * How long one campaign attempt waits for the lock before it starts over. Releases wake it
 * earlier; starting over costs one attempt.
 */
const CAMPAIGN_WAIT = 60_000;

/** Checks `lead()`'s own arguments. Throws `LockArgumentError`. */
export function assertLeadArguments(work: unknown, options: unknown): void {
  if (typeof work !== 'function') throw new LockArgumentError('work', work, 'must be a function');
  const problem = leadOptionsProblem(options);
  if (problem) throw new LockArgumentError(...problem);
}

/**
 * @internal Campaigns for `key` until stopped: takes the lock (waiting on its release messages, as every
 * waiter does), runs `work` for the term, releases, and campaigns again. A term that ends by
 * itself (its work settled or the lock was lost) is followed by a pause of `pause` ms before the
 * next campaign, so the others get a turn and a work that returns at once does not spin.
 */
export class Campaign implements Leadership {
  private readonly stopper = new AbortController();
  /** Why the campaign ended, once `stop()` or the shutdown ended it: its stopper's reason. */
  private stopped: LeadershipStoppedError | undefined;
  private readonly subject = new Subject<boolean>();
  /** The values `changes` is telling its subscribers, in order (see `change`). */
  private readonly changing: boolean[] = [];
  /** The current term's lock, while it runs. */
  private termLock: Lock | undefined;
  /** The current term, from its start until it ends (its signal aborts or its work settles). */
  private current: { term: LeaderTerm; started: number } | undefined;
  /** The `elected()` calls waiting for a term. */
  private readonly electors = new Set<{
    resolve(term: LeaderTerm): void;
    reject(error: Error): void;
  }>();
  /** Ends the current term without waiting for its work: `stop()` from inside that work. */
  private leaveTerm: (() => void) | undefined;
  /** The current term's work, or the last one, settled either way: what shutdown waits for. */
  private working: Promise<void> = Promise.resolve();
  /** Settles when the campaign is over (after `stop()`, or when the module shuts down). */
  readonly done: Promise<void>;
  readonly changes: Observable<boolean> = this.subject.asObservable();

  /** Failed campaign attempts while Redis cannot be reached: logged once per outage. */
  private readonly outage: OutageLog;
  /** Renews its stay among the participants (see `stay`). */
  private staying: NodeJS.Timeout | undefined;
  /** Its own entry among the participants: another campaign may have the same id. */
  private readonly entry: string;

  constructor(
    readonly key: string,
    readonly id: string,
    private readonly work: (term: LeaderTerm) => unknown,
    readonly ttl: number,
    private readonly pause: number,
    private readonly runTerm: TermRunner,
    private readonly logger: Logger,
    /** How log lines show keys (the module's `logKeys`). */
    readonly view: KeyView,
    private readonly events: LockEvents,
  ) {
    this.entry = `${randomBytes(4).toString('hex')}:${id}`;
    this.outage = new OutageLog(logger, `Campaign for leadership of ${view(key)}`);
    this.done = outsideLocks(() => this.campaign());
  }

  get isLeader(): boolean {
    return this.current !== undefined;
  }

  /** What the health check shows: leading now, following, or failing (its last attempt failed). */
  get state(): 'leading' | 'following' | 'failing' {
    return this.current ? 'leading' : this.outage.failing ? 'failing' : 'following';
  }

  /** Whether `stop()` or the shutdown has been asked for. */
  get stopping(): boolean {
    return this.stopped !== undefined;
  }

  stop(by: 'stop' | 'shutdown' = 'stop'): Promise<void> {
    this.giveUp(by);
    // From inside the term's work (its call chain runs under the term's lock, even one released
    // or lost meanwhile): never wait for it.
    const term = this.termLock;
    if (term && inChainOf(term)) this.leaveTerm?.();
    return this.done;
  }

  /**
   * Listed among the participants while it campaigns (see `participants()`), for `ttl` more ms
   * (0: no longer): renewed every third of its TTL, so that a campaign that died drops out within
   * its TTL. Not waited for: a write that fails leaves the stay to run out.
   */
  private stay(ms = this.ttl): void {
    this.runTerm.participate(this.key, this.entry, ms).catch(() => undefined);
    // Leading: the term's record again (see `recordTerm`): a Redlock node that got the lock's copy
    // since has it from now on.
    const lock = this.termLock;
    if (ms > 0 && lock && this.current) this.record(lock);
  }

  /** Records the term of `lock` for `leader()` (see `TermRunner.recordTerm`); a failure is logged. */
  private record(lock: Lock): void {
    this.runTerm.recordTerm(lock, this.id, this.ttl).catch((error: unknown) => {
      if (!this.current || this.termLock !== lock) return; // the term is over: nothing to tell
      this.logger.warn(
        `Could not record term ${lock.fence} of ${this.view(this.key)} for leader(): ${String(error)}`,
      );
    });
  }

  /**
   * Ends the campaign (once): its term's signal and every `elected()` waiting are told why; it
   * leaves the participants at once (the write goes out before shutdown closes the connection).
   */
  private giveUp(by: 'stop' | 'shutdown'): void {
    if (this.stopped) return;
    clearInterval(this.staying);
    this.stay(0);
    this.stopped = new LeadershipStoppedError(this.key, by, this.view);
    this.stopper.abort(this.stopped);
    for (const elector of this.electors) elector.reject(this.stopped);
  }

  elected(options?: ElectedOptions): Promise<LeaderTerm> {
    const problem = electedOptionsProblem(options);
    if (problem) return Promise.reject(new LockArgumentError(...problem));
    const { timeout, signal } = options ?? {};
    const aborted = (): LockAcquireAbortedError =>
      new LockAcquireAbortedError(this.key, signal?.reason, this.view, 'Waiting to lead');
    const late = (): LeaderElectionTimeoutError =>
      new LeaderElectionTimeoutError(this.key, timeout ?? 0, this.view);
    if (signal?.aborted) return Promise.reject(aborted());
    if (this.stopped) return Promise.reject(this.stopped);
    if (this.current) return Promise.resolve(this.current.term);
    if (timeout === 0) return Promise.reject(late());
    return new Promise<LeaderTerm>((resolve, reject) => {
      let timer: NodeJS.Timeout | undefined;
      const settle = (): void => {
        clearTimeout(timer);
        signal?.removeEventListener('abort', onAbort);
        this.electors.delete(elector);
      };
      const elector = {
        resolve: (term: LeaderTerm) => (settle(), resolve(term)),
        reject: (error: Error) => (settle(), reject(error)),
      };
      const onAbort = (): void => elector.reject(aborted());
      if (timeout !== undefined) {
        // A timer may fire a little early on this clock: never before `timeout` has passed.
        const deadline = performance.now() + timeout;
        const arm = (ms: number): void => {
          timer = setTimeout(() => {
            const left = deadline - performance.now();
            if (left > 0) arm(Math.ceil(left));
            else elector.reject(late());
          }, ms);
        };
        arm(timeout);
      }
      signal?.addEventListener('abort', onAbort, { once: true });
      this.electors.add(elector);
    });
  }

  leader(): Promise<LeaderInfo | null> {
    return this.runTerm.leader(this.key);
  }

  /** The current (or last) term's work settled: what shutdown waits for, up to the TTL. */
  get workSettled(): Promise<void> {
    return this.working;
  }

  private async campaign(): Promise<void> {
    const stopped = this.stopper.signal;
    const options: AcquireOptions = {
      ttl: this.ttl,
      autoExtend: true,
      acquireTimeout: CAMPAIGN_WAIT,
      signal: stopped,
      [NOT_COUNTED]: true,
      [LOSS_REPORTED]: true,
    } as AcquireOptions;
    this.stay();
    this.staying = setInterval(() => this.stay(), this.ttl / 3);
    this.staying.unref();
    while (!stopped.aborted) {
      try {
        // After a failed attempt, one read first: Redis answering ends the outage now, not when
        // this campaign next leads or its long wait for the lock ends.
        if (this.outage.failing) {
          await this.runTerm.probe(this.key);
          this.outage.recovered();
        }
        await this.runTerm.run(this.key, (lock) => this.term(lock), options);
      } catch (error) {
        if (stopped.aborted || error instanceof RedisLockShutdownError) break;
        if (error instanceof LockAcquireTimeoutError) {
          this.outage.recovered(); // Redis answered: someone else leads
          continue;
        }
        this.outage.failed(error, `trying again every ${this.pause} ms`);
      }
      await sleep(this.pause, undefined, { signal: stopped }).catch(() => undefined);
    }
    // Stopped while an attempt was on its way: its grant, if it comes, is undone before `stop()`
    // resolves, so that a stopped campaign holds nothing.
    await this.runTerm.undone(this.key);
    this.giveUp('shutdown'); // ended by the engine's shutdown before the module's own stop
    this.subject.complete();
  }

  /**
   * One term: leads until `work` settles or the term's signal aborts, whichever is first. A grant
   * that lands after `stop()` (in the same tick) starts no term: the work never runs with its
   * signal already aborted, and `isLeader` never turns true. A `stop()` from inside the work ends
   * the term at once (the lock is released by `using()` as the term returns) and leaves the work
   * to finish on its own.
   */
  private async term(lock: Lock): Promise<void> {
    this.outage.recovered();
    // Aborted when the work settles: whoever kept the term's signal (a fork of the work, an
    // `elected()` caller) learns that the term is over.
    const settled = new AbortController();
    const signal = AbortSignal.any([lock.signal, this.stopper.signal, settled.signal]);
    // Stopped, or the lease already over (the process stalled past it since the grant): no term.
    if (signal.aborted) return;
    const term: LeaderTerm = { key: this.key, id: this.id, fence: lock.fence, signal };
    const cease = (): void => this.endTerm(lock);
    signal.addEventListener('abort', cease, { once: true });
    this.termLock = lock;
    const left = new Promise<void>((resolve) => (this.leaveTerm = resolve));
    try {
      // For anyone to read (`leader()`), also a term a listener ends as it begins; the term does
      // not wait for it.
      this.record(lock);
      this.beginTerm(term);
      // Ended already by whoever heard it begin (a `changes` subscriber that stopped it): the
      // work never runs with its signal aborted.
      if (signal.aborted) return;
      // Called at once (a throw becomes a rejection), in this call chain: it holds the term's lock.
      const work = new Promise((resolve) => resolve(this.work(term))).catch((error: unknown) => {
        if (signal.aborted) return;
        this.logger.error(
          `Leader work for ${this.view(this.key)} (term ${lock.fence}) failed; campaigning again: ${String(error)}`,
          error instanceof Error ? error.stack : undefined,
        );
      });
      this.working = work.then(() => undefined);
      await Promise.race([work, left]);
    } finally {
      this.termLock = this.leaveTerm = undefined;
      settled.abort(new LockLostError(this.key, lock.token, 'released', { view: this.view }));
      signal.removeEventListener('abort', cease);
      this.endTerm(lock);
      if (lock.signal.aborted && !this.stopper.signal.aborted) {
        this.logger.warn(
          `Lost leadership of ${this.view(this.key)} (term ${lock.fence}): ${String(lock.signal.reason)}`,
        );
      }
    }
  }

  /** A term starts: `isLeader`, `changes`, the `elected()` calls waiting and the events hear it. */
  private beginTerm(term: LeaderTerm): void {
    this.current = { term, started: performance.now() };
    if (this.events.observed) {
      this.events.emit({ type: 'elected', key: this.key, id: this.id, fence: term.fence });
    }
    this.change(true);
    for (const elector of this.electors) {
      if (term.signal.aborted) break; // ended by a listener: they wait for the next term
      elector.resolve(term);
    }
  }

  /**
   * Tells `changes`, in order: a subscriber that stops the leadership as it hears `true` makes
   * the `false` come after every subscriber heard the `true`.
   */
  private change(leading: boolean): void {
    this.changing.push(leading);
    if (this.changing.length > 1) return; // told by the call that is telling now
    while (this.changing.length > 0) {
      this.subject.next(this.changing[0]);
      this.changing.shift();
    }
  }

  /** The current term ends (once): its signal aborted, or its work settled first. */
  private endTerm(lock: Lock): void {
    const ended = this.current;
    if (!ended) return;
    this.current = undefined;
    this.change(false);
    if (!this.events.observed) return;
    const stopped = this.stopped;
    this.events.emit({
      type: 'deposed',
      key: this.key,
      id: this.id,
      fence: ended.term.fence,
      heldMs: performance.now() - ended.started,
      reason: stopped ? stopped.by : lock.signal.aborted ? 'lost' : 'settled',
    });
  }
}

/** @internal The leaderships of one `LockService`: started by `lead()`, stopped at shutdown. */
export class Leaderships {
  private readonly campaigns = new Set<Campaign>();
  /** The participant id of this service's leaderships that name none. */
  readonly defaultId = `${hostname()}:${process.pid}:${randomBytes(4).toString('hex')}`;

  constructor(
    private readonly runTerm: TermRunner,
    private readonly logger: Logger,
    private readonly view: KeyView,
    private readonly events: LockEvents,
  ) {}

  /** Starts campaigning (see `LockService.lead`); its arguments are checked. */
  start(
    key: string,
    work: (term: LeaderTerm) => unknown,
    ttl: number,
    pause: number,
    id = this.defaultId,
  ): Leadership {
    const campaign = new Campaign(
      key,
      id,
      work,
      ttl,
      pause,
      this.runTerm,
      this.logger,
      this.view,
      this.events,
    );
    this.campaigns.add(campaign);
    void campaign.done.then(() => this.campaigns.delete(campaign));
    return campaign;
  }

  /** Each leadership campaigning now: its key (as events show keys), id and state. */
  report(): { key: string; id: string; state: Campaign['state'] }[] {
    return [...this.campaigns]
      .filter((campaign) => !campaign.stopping)
      .map(({ key, id, state }) => ({ key: this.events.shown(key), id, state }));
  }

  /** The first leadership campaigning for `key` that is not stopped, if any. */
  find(key: string): Leadership | undefined {
    for (const campaign of this.campaigns) {
      if (campaign.key === key && !campaign.stopping) return campaign;
    }
    return undefined;
  }

  /**
   * Shutdown, first step: stops every leadership, its term's `signal`
   * aborted and its work waited for, up to the longest leader TTL; a work that ignores its signal
   * longer is logged. Their locks' releases go on, within the engine's one shutdown deadline.
   */
  async stopAll(): Promise<void> {
    const campaigns = [...this.campaigns];
    if (campaigns.length === 0) return;
    for (const campaign of campaigns) void campaign.stop('shutdown');
    const longest = Math.max(...campaigns.map((campaign) => campaign.ttl));
    const settled = new Set<Campaign>();
    await within(
      Promise.all(
        campaigns.map((campaign) => campaign.workSettled.then(() => settled.add(campaign))),
      ),
      longest,
      [],
    ).catch((error: unknown) => {
      ignoreDeadline(error);
      for (const campaign of campaigns.filter((each) => !settled.has(each))) {
        this.logger.warn(
          `Leader work for ${this.view(campaign.key)} did not return within ${campaign.ttl} ms of its term's signal aborting on shutdown: its lock is released now, and another instance may lead while it still runs (its stale fence is what stops its writes)`,
        );
      }
    });
  }

  /** Shutdown, last step: stops what is left (started late) without waiting for it. */
  abortAll(): void {
    for (const campaign of this.campaigns) void campaign.stop('shutdown');
  }
}
