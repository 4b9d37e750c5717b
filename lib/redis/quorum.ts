import { LockQuorumError } from '../errors/redis-lock.errors.js';
import { ReplyDeadlines } from '../utils/reply-deadlines.js';
import { DEADLINE } from '../utils/within.js';
import { describeFailure } from './connections.js';

/** What the nodes answered in one round. */
export interface Tally<T> {
  yes: { node: number; value: T }[];
  no: { node: number; value: T }[];
  failed: { node: number; error: unknown }[];
}

/** One command sent to every node: the raw replies, and the tally once the round is decided. */
export interface Round<T> {
  replies: Promise<T>[];
  /** Each reply bounded by `commandTimeout`. */
  answers: Promise<T>[];
  decided: Promise<Tally<T>>;
}

/**
 * The votes of N independent nodes (Redlock's masters) on one operation: sent to all at once,
 * each reply bounded by `commandTimeout`, decided as soon as a majority agrees or can no longer
 * agree, so a paused or dead minority costs no time.
 */
export class Quorum<N> {
  /** How many nodes make a majority. */
  readonly size: number;
  private readonly deadlines: ReplyDeadlines;

  constructor(
    private readonly nodes: readonly N[],
    private readonly commandTimeout: number,
  ) {
    this.size = Math.floor(nodes.length / 2) + 1;
    this.deadlines = new ReplyDeadlines(commandTimeout);
  }

  /**
   * A yes/no question to every node: true when a majority says yes, false when a majority says no
   * (or more than a minority, so that yes can no longer win), and `LockQuorumError` when too few
   * answered to tell.
   */
  async majority(call: (node: N) => Promise<boolean>): Promise<boolean> {
    return this.verdict(await this.ask(call, (yes) => yes).decided);
  }

  /** A decided yes/no round's answer (see `majority`). */
  verdict(tally: Tally<boolean>): boolean {
    if (tally.yes.length >= this.size) return true;
    if (tally.no.length > this.nodes.length - this.size) return false;
    throw this.failure(tally);
  }

  /**
   * Sends `call` to every node at once, each reply bounded by `commandTimeout`. The round is
   * decided when a majority says yes, when so many said no or failed that a majority can no longer
   * say yes, or when every node has answered.
   */
  ask<T>(call: (node: N, index: number) => Promise<T>, isYes: (value: T) => boolean): Round<T> {
    const replies = this.nodes.map((node, index) => call(node, index));
    const answers = replies.map((reply) => this.deadlines.bound(reply));
    const decided = new Promise<Tally<T>>((resolve) => {
      const tally: Tally<T> = { yes: [], no: [], failed: [] };
      let open = replies.length;
      const counted = (): void => {
        open--;
        if (
          open === 0 ||
          tally.yes.length >= this.size ||
          tally.no.length + tally.failed.length > this.nodes.length - this.size
        ) {
          resolve({ yes: [...tally.yes], no: [...tally.no], failed: [...tally.failed] });
        }
      };
      answers.forEach((answer, node) => {
        answer.then(
          (value) => {
            (isYes(value) ? tally.yes : tally.no).push({ node, value });
            counted();
          },
          (error: unknown) => {
            tally.failed.push({ node, error });
            counted();
          },
        );
      });
    });
    return { replies, answers, decided } satisfies Round<T>;
  }

  /** Every node's answer to `round` (or its failure, within `commandTimeout`), tallied. */
  async everyAnswer<T>(round: Round<T>, isYes: (value: T) => boolean): Promise<Tally<T>> {
    const tally: Tally<T> = { yes: [], no: [], failed: [] };
    (await Promise.allSettled(round.answers)).forEach((answer, node) => {
      if (answer.status === 'rejected') tally.failed.push({ node, error: answer.reason });
      else (isYes(answer.value) ? tally.yes : tally.no).push({ node, value: answer.value });
    });
    return tally;
  }

  /** `reply`, bounded by `commandTimeout` as every reply of a round is. */
  bounded<T>(reply: Promise<T>): Promise<T> {
    return this.deadlines.bound(reply);
  }

  /** The error of a round too few nodes answered to decide. */
  failure(tally: Tally<unknown>): LockQuorumError {
    return new LockQuorumError(
      this.nodes.length,
      this.size,
      tally.yes.length + tally.no.length,
      tally.failed.map(
        ({ node, error }) => `node ${node}: ${describeFailure(error, this.commandTimeout)}`,
      ),
      tally.failed.some(({ error }) => error === DEADLINE),
    );
  }
}
