import type { Logger } from '@nestjs/common';
import { Subject, type Observable } from 'rxjs';
import { setTimeout as sleep } from 'node:timers/promises';
import {
  LeadershipStoppedError,
  LockAcquireTimeoutError,
  LockArgumentError,
  RedisLockShutdownError,
  type KeyView,
} from './errors/redis-lock.errors.js';
import type { AcquireOptions, Lock } from './interfaces/lock.interface.js';
import { inChainOf, outsideLocks } from './engine/lock.context.js';
import { ignoreDeadline, within } from './utils/within.js';
import { leadOptionsProblem, NOT_COUNTED } from './options/acquire-options.js';
import { OutageLog } from './utils/outage-log.js';

/** One term of a leadership: what `work` gets while this instance leads. */
export interface LeaderTerm {
  /** The leadership's key, without the module's `keyPrefix`. */
  readonly key: string;
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

/** A campaign for leadership started by `LockService.lead()`. */
export interface Leadership {
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
}

/** Options of `LockService.lead()` and `@WhileLeader`. */
export interface LeadOptions {
  /**
   * The leader lock's TTL (ms), extended while the leader works: how long after this instance
   * dies or freezes another can take over.
   * @default 10_000 (or the module's `defaults.ttl`)
   */
  ttl?: number;
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
  private readonly subject = new Subject<boolean>();
  private leading = false;
  private over = false;
  /** The current term's lock, while it runs. */
  private termLock: Lock | undefined;
  /** Ends the current term without waiting for its work: `stop()` from inside that work. */
  private leaveTerm: (() => void) | undefined;
  /** The current term's work, or the last one, settled either way: what shutdown waits for. */
  private working: Promise<void> = Promise.resolve();
  /** Settles when the campaign is over (after `stop()`, or when the module shuts down). */
  readonly done: Promise<void>;
  readonly changes: Observable<boolean> = this.subject.asObservable();

  /** Failed campaign attempts while Redis cannot be reached: logged once per outage. */
  private readonly outage: OutageLog;

  constructor(
    readonly key: string,
    private readonly work: (term: LeaderTerm) => unknown,
    readonly ttl: number,
    private readonly pause: number,
    private readonly runTerm: TermRunner,
    private readonly logger: Logger,
    /** How log lines show keys (the module's `logKeys`). */
    readonly view: KeyView,
  ) {
    this.outage = new OutageLog(logger, `Campaign for leadership of ${view(key)}`);
    this.done = outsideLocks(() => this.campaign());
  }

  get isLeader(): boolean {
    return this.leading;
  }

  /** Whether the campaign is over (stopped, and its last term's work settled). */
  get ended(): boolean {
    return this.over;
  }

  stop(by: 'stop' | 'shutdown' = 'stop'): Promise<void> {
    if (!this.stopper.signal.aborted)
      this.stopper.abort(new LeadershipStoppedError(this.key, by, this.view));
    // From inside the term's work (its call chain runs under the term's lock, even one released
    // or lost meanwhile): never wait for it.
    const term = this.termLock;
    if (term && inChainOf(term)) this.leaveTerm?.();
    return this.done;
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
    } as AcquireOptions;
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
    this.over = true;
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
    if (this.stopper.signal.aborted) return;
    const signal = AbortSignal.any([lock.signal, this.stopper.signal]);
    const cease = (): void => this.change(false);
    signal.addEventListener('abort', cease, { once: true });
    this.termLock = lock;
    const left = new Promise<void>((resolve) => (this.leaveTerm = resolve));
    this.change(true);
    const term = { key: this.key, fence: lock.fence, signal };
    // Called at once (a throw becomes a rejection), in this call chain: it holds the term's lock.
    const work = new Promise((resolve) => resolve(this.work(term))).catch((error: unknown) => {
      if (signal.aborted) return;
      this.logger.error(
        `Leader work for ${this.view(this.key)} (term ${lock.fence}) failed; campaigning again: ${String(error)}`,
        error instanceof Error ? error.stack : undefined,
      );
    });
    this.working = work.then(() => undefined);
    try {
      await Promise.race([work, left]);
    } finally {
      this.termLock = this.leaveTerm = undefined;
      signal.removeEventListener('abort', cease);
      this.change(false);
      if (lock.signal.aborted && !this.stopper.signal.aborted) {
        this.logger.warn(
          `Lost leadership of ${this.view(this.key)} (term ${lock.fence}): ${String(lock.signal.reason)}`,
        );
      }
    }
  }

  private change(leading: boolean): void {
    if (this.leading === leading) return;
    this.leading = leading;
    this.subject.next(leading);
  }
}

/** @internal The leaderships of one `LockService`: started by `lead()`, stopped at shutdown. */
export class Leaderships {
  private readonly campaigns = new Set<Campaign>();

  constructor(
    private readonly runTerm: TermRunner,
    private readonly logger: Logger,
    private readonly view: KeyView,
  ) {}

  /** Starts campaigning (see `LockService.lead`); its arguments are checked. */
  start(key: string, work: (term: LeaderTerm) => unknown, ttl: number, pause: number): Leadership {
    const campaign = new Campaign(key, work, ttl, pause, this.runTerm, this.logger, this.view);
    this.campaigns.add(campaign);
    void campaign.done.then(() => this.campaigns.delete(campaign));
    return campaign;
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
