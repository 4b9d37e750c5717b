// A node:test reporter for scripts/test-run.mjs: one JSON line per failed test (not per suite
// that failed because a test in it did), with the test's name and the first lines of its error.
export default async function* failures(source) {
  for await (const event of source) {
    if (event.type !== 'test:fail') continue;
    const error = event.data.details?.error;
    if (error?.failureType === 'subtestsFailed') continue;
    const cause = error?.cause ?? error;
    const message = String(cause?.message ?? cause ?? 'failed')
      .split('\n')
      .filter((line) => line.trim() !== '')
      .slice(0, 6)
      .join(' | ');
    yield `${JSON.stringify({ name: event.data.name, message })}\n`;
  }
}
