// A Stryker reporter that writes each mutant's result as it is known, one JSON line each, to
// `.stryker-reports/<group>.jsonl`: a long group's run (an hour or more) stopped before its end
// leaves what it measured (Stryker's own reports are written only at the end). The lines are
// `{ file, line, column, end, mutator, replacement, status, killedBy }`; `npm run test:mutation`
// reads the JSON report, not these.
import { appendFileSync, mkdirSync, writeFileSync } from 'node:fs';
import { dirname, relative } from 'node:path';
import { PluginKind, commonTokens, declareClassPlugin } from '@stryker-mutator/api/plugin';

class ProgressReporter {
  static inject = [commonTokens.options];

  constructor(options) {
    this.path = options.jsonReporter.fileName.replace(/\.json$/, '.jsonl');
    mkdirSync(dirname(this.path), { recursive: true });
    writeFileSync(this.path, '');
  }

  onMutantTested(result) {
    const line = {
      file: relative(process.cwd(), result.fileName),
      line: result.location.start.line,
      column: result.location.start.column,
      end: `${result.location.end.line}:${result.location.end.column}`,
      mutator: result.mutatorName,
      replacement: result.replacement,
      status: result.status,
      killedBy: result.killedBy,
    };
    appendFileSync(this.path, `${JSON.stringify(line)}\n`);
  }
}

export const strykerPlugins = [
  declareClassPlugin(PluginKind.Reporter, 'progress-jsonl', ProgressReporter),
];
