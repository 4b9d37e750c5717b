import { readFileSync } from 'node:fs';
import { after, before, describe, it } from 'node:test';
import fc from 'fast-check';
import { LogCapture, uniqueKey } from '../support/lock-module.js';
import { watchStalls } from '../support/timing.js';
import type { App, Deployment } from './model-deployment.js';
import { Model } from './model-state.js';
import { ALL_SCRIPTS, drive, replay, settle, steps, type Real } from './model-steps.js';

/**
 * `MODEL_RUNS` random sequences (default 12) of up to `MODEL_STEPS` steps (default 40), after
 * every kept sequence of `model-corpus.json` (each one that found a bug, replayed as it is);
 * `MODEL_SEED` replays one random run (fast-check prints the seed, and the shrunk sequence as
 * JSON lines to keep in the corpus, with the `variant` its failure names), `MODEL_PATH` with it the
 * failing run's path (it alone, then its shrinking). `MODEL_SHRINK=0` stops at the first failure.
 */
const RUNS = process.env.MODEL_RUNS === undefined ? undefined : Number(process.env.MODEL_RUNS);
const STEPS = Number(process.env.MODEL_STEPS ?? 40);
/**
 * The random sequences' seed: `MODEL_SEED`, else a fresh one, printed as the random runs begin
 * (and in their test's name): a run cut off before fast-check reports still says how to replay it.
 */
const SEED =
  process.env.MODEL_SEED === undefined
    ? (Math.random() * 2 ** 32) | 0
    : Number(process.env.MODEL_SEED);

/**
 * How long the gate's random sequences may run, their shrinking included, before fast-check stops
 * and reports what it has (a failure shrunk so far, or a pass with the sequences that ran): they
 * take ~20 s, and a failure's shrinking could otherwise run past the file's own timeout, which
 * ends the run with neither the seed's failure nor its sequence (seen once: 400 s, no report).
 * With `MODEL_RUNS` (a deep run, no file timeout), no limit.
 */
const RANDOM_LIMIT_MS = RUNS === undefined ? 200_000 : undefined;

/**
 * Longest a sequence may take, its settling included: its steps are each bounded by seconds (the
 * longest a 30 s lease, which no step waits out), so one that runs past this has hung.
 */
const SEQUENCE_LIMIT_MS = 120_000;
/**
 * The most scripts one server may run a second, over any 200 ms or more of steps: far above what
 * the steps ask for (a crowd of a dozen callers on a key runs tens), far below waiters that spin
 * (each woken by the announcement of another's failed attempt, failing in turn: 3,000 to 85,000 a
 * second in Redlock mode, found by a reviewer's script).
 */
const SPIN_LIMIT = 1_000;

/**
 * Seeds whose first random sequence runs on every gate run, whatever `MODEL_RUNS` says: a fixed
 * part of the suite, so that a run of the gate never covers less than they do.
 */
const FIXED_SEEDS = [1, 2, 3, 4, 5, 6];

/** A kept sequence: what it found, and its steps as JSON. */
interface Kept {
  readonly found: string;
  readonly steps: readonly (readonly unknown[])[];
  /** The variant it found it in (see `Deployment.begin`); else its number in the run. */
  readonly variant?: number;
}
const corpus = JSON.parse(
  readFileSync(new URL('../../../test/model/model-corpus.json', import.meta.url), 'utf8'),
) as Kept[];

/**
 * The model-based suite on one deployment: the kept sequences, then random ones. Each sequence
 * gets keys of its own and two fresh apps (so that nothing a failed one left behind leaks into
 * the next), and ends with `settle`.
 */
export function modelSuite(
  name: string,
  start: () => Promise<Deployment>,
  /** Random sequences unless `MODEL_RUNS` says (the gate's share of its time). */
  gateRuns = 12,
): void {
  const runs = RUNS ?? gateRuns;
  describe(`the lock against a model (fast-check): ${name}`, () => {
    let deployment: Deployment;
    const problems: string[] = [];
    const onRejection = (reason: unknown): void =>
      void problems.push(`unhandled rejection: ${String(reason)}`);
    const onWarning = (warning: Error): void =>
      void problems.push(`Node warning: ${warning.name}: ${warning.message}`);

    // What the apps log: a leftover the library says it leaves (see `Model.said`).
    let logs = new LogCapture();
    let restoreLogs = (): void => {};
    before(async () => {
      ({ capture: logs, restore: restoreLogs } = LogCapture.install());
      deployment = await start();
      process.on('unhandledRejection', onRejection);
      process.on('warning', onWarning);
    });
    after(async () => {
      process.off('unhandledRejection', onRejection);
      process.off('warning', onWarning);
      restoreLogs();
      await deployment?.stop();
    });

    const totals = { sequences: 0, steps: 0, grants: 0, views: 0, freed: 0 };
    async function runSequence(
      sequence: Iterable<fc.AsyncCommand<Model, Real>>,
      variant = totals.sequences,
    ): Promise<void> {
      deployment.begin(variant);
      // Where the sequence is: a start, a step or the settling that never ends is a call of the
      // library's that never settled, said with the sequence (printed at once: the file's own
      // timeout would otherwise end the run without the sequence that hung). Armed first: an app
      // whose start hung was once no sequence's, and the run ended silent at the file's timeout.
      let at = 'starting';
      /** Since when, and from what counts, the scripts each server runs are being counted. */
      let counted: { since: number; from: number[]; steps: string[] } | undefined;
      const countScripts = async (m: Model, step: string): Promise<void> => {
        const now = performance.now();
        if (counted && now - counted.since < 200) {
          counted.steps.push(step);
          return;
        }
        const ran = await deployment.scriptsRun();
        if (counted) {
          const { since, from, steps: during } = counted;
          // (A server restarted meanwhile counts from 0 again.)
          const most = Math.max(0, ...ran.map((n, i) => n - (from[i] ?? 0)));
          if ((most * 1_000) / (now - since) > SPIN_LIMIT) {
            m.violations.push(
              `one server ran ${most} scripts in ${Math.round(now - since)} ms (more than ${SPIN_LIMIT} a second: waiters spinning?) during ${[...during, step].join(', ')}`,
            );
          }
        }
        counted = { since: performance.now(), from: ran, steps: [] };
      };
      const steps = [...sequence].map((step) => ({
        check: (m: Readonly<Model>) => step.check(m),
        run: async (m: Model, r: Real) => {
          at = `step ${step.toString()}`;
          await step.run(m, r);
          await countScripts(m, step.toString());
        },
        toString: () => step.toString(),
      }));
      let timer: NodeJS.Timeout | undefined;
      const hung = new Promise<never>((_, reject) => {
        timer = setTimeout(() => {
          const message = `a sequence never settled: at ${at} after ${SEQUENCE_LIMIT_MS / 1_000} s; the sequence: ${steps.map(String).join(', ')}`;
          console.error(message);
          reject(new Error(message));
        }, SEQUENCE_LIMIT_MS);
      });
      hung.catch(() => undefined); // raced below; unawaited if the sequence ends first
      logs.lines.length = 0;
      const start = async (): Promise<App[]> => {
        at = 'starting: flushing the scripts';
        await deployment.flushScripts(ALL_SCRIPTS);
        at = 'starting the apps';
        return [await deployment.startApp(0, 0), await deployment.startApp(1, 1)];
      };
      let apps: App[];
      try {
        apps = await Promise.race([start(), hung]);
      } catch (error) {
        clearTimeout(timer);
        throw error;
      }
      at = 'started';
      const stalls = watchStalls();
      const model = new Model(
        uniqueKey('model'),
        deployment,
        deployment.commandTimeout,
        stalls,
        problems,
        logs.lines,
      );
      const real: Real = { deployment, apps, generations: 1, flows: [], leaders: [] };
      drive(model, real);
      try {
        await Promise.race([fc.asyncModelRun(() => ({ model, real }), steps), hung]);
      } catch (error) {
        // What a kept sequence needs besides its steps to find it again.
        throw new Error(`(variant ${variant}) ${String(error)}`, { cause: error });
      } finally {
        try {
          at = 'settle';
          await Promise.race([settle(model, real), hung]);
        } finally {
          clearTimeout(timer);
          stalls.stop();
          totals.sequences++;
          totals.steps += [...sequence].length;
          totals.grants += model.held.filter((held) => !held.view).length;
          totals.views += model.held.filter((held) => held.view).length;
          totals.freed += model.freed;
        }
      }
    }

    it(`replays the ${corpus.length} kept sequences`, async () => {
      for (const kept of corpus) {
        await runSequence(kept.steps.map(replay), kept.variant).catch((error: unknown) => {
          throw new Error(`kept sequence (${kept.found}) failed: ${String(error)}`, {
            cause: error,
          });
        });
      }
    });

    const property = fc.asyncProperty(
      fc.commands(steps, { maxCommands: STEPS, size: 'max' }),
      (sequence) => runSequence(sequence),
    );
    const options = {
      endOnFailure: process.env.MODEL_SHRINK === '0',
      includeErrorInReport: true,
      // With MODEL_SEED, the `path` fast-check printed: that run alone, then its shrinking.
      path: process.env.MODEL_PATH,
    };

    // The same sequences on every run of the gate (and on every deployment): what they cover is
    // covered every time; the random ones below add to it.
    if (process.env.MODEL_SEED === undefined) {
      it(`holds on the ${FIXED_SEEDS.length} fixed seeds' first sequences`, async () => {
        for (const seed of FIXED_SEEDS) await fc.assert(property, { ...options, seed, numRuns: 1 });
      });
    }

    it(`holds on ${runs} random sequences of up to ${STEPS} steps (seed ${SEED})`, async (t) => {
      console.log(`${name}: random sequences from seed ${SEED} (MODEL_SEED=${SEED} replays them)`);
      try {
        await fc.assert(property, {
          ...options,
          numRuns: runs,
          seed: SEED,
          interruptAfterTimeLimit: RANDOM_LIMIT_MS,
        });
      } finally {
        t.diagnostic(
          `${totals.sequences} sequences (kept and shrinking included), ${totals.steps} steps, ${totals.grants} locks granted, ${totals.views} re-entries, ${totals.freed} holders freed by forceRelease`,
        );
      }
    });
  });
}
