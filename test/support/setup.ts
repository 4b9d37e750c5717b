/**
 * Loaded into every test file (node --import). Fails the file when it leaves behind an open
 * handle (socket, timer, child process) or an unhandled rejection, or when Node printed a warning
 * (a listener leak, a deprecation): what a user would see in their own logs. Test files keep their tests
 * and teardown inside a top-level describe(), whose after() hooks run before this check.
 */
import { after } from 'node:test';
import 'reflect-metadata';

const ignored = new Set([
  'CloseReq',
  'FSReqCallback',
  'PipeWrap',
  'TTYWrap',
  'Immediate',
  'TickObject',
]);
const baseline = tally();
const unhandled: unknown[] = [];

process.on('unhandledRejection', (reason) => {
  unhandled.push(reason);
  process.exitCode = 1;
});

const warnings: string[] = [];
process.on('warning', (warning) => {
  warnings.push(`${warning.name}: ${warning.message}`);
  process.exitCode = 1;
});

after(async () => {
  let leaked = excess();
  for (let waited = 0; leaked.length > 0 && waited < 2_000; waited += 50) {
    await new Promise((resolve) => setTimeout(resolve, 50).unref());
    leaked = excess();
  }
  if (unhandled.length > 0 || leaked.length > 0 || warnings.length > 0) {
    // A leaked handle would keep this process alive: make sure it ends, and ends failed.
    process.exitCode = 1;
    setTimeout(() => process.exit(1), 1_000).unref();
    throw new Error(
      [
        unhandled.length ? `unhandled rejections: ${unhandled.map(String).join('; ')}` : '',
        leaked.length ? `open handles after all tests: ${leaked.join(', ')}` : '',
        warnings.length ? `Node warnings: ${warnings.join('; ')}` : '',
      ].join(' '),
    );
  }
});

function tally(): Map<string, number> {
  const counts = new Map<string, number>();
  for (const type of process.getActiveResourcesInfo()) {
    if (!ignored.has(type)) counts.set(type, (counts.get(type) ?? 0) + 1);
  }
  return counts;
}

function excess(): string[] {
  const now = tally();
  const extra: string[] = [];
  for (const [type, count] of now) {
    const over = count - (baseline.get(type) ?? 0);
    if (over > 0) extra.push(`${over} × ${type}`);
  }
  return extra;
}
