import { writeFileSync } from 'node:fs';
import { format, resolveConfig } from 'prettier';

/**
 * Writes a generated markdown report formatted as the project's Prettier settings want it, so a
 * freshly generated report passes `npm run lint` as it is.
 */
export async function writeMarkdown(path: string, text: string): Promise<void> {
  const options = (await resolveConfig(path)) ?? {};
  writeFileSync(path, await format(text, { ...options, filepath: path }));
}
