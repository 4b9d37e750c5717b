import {
  LockKeyResolutionError,
  RedisLockConfigurationError,
} from '../errors/redis-lock.errors.js';

/** Builds the lock key (or keys) from a call's arguments. */
export type LockKeyResolver = (args: readonly unknown[]) => string | string[];

type Part =
  | string
  | { readonly placeholder: string; readonly index: number; readonly path: readonly string[] };

const PLACEHOLDER = /^(\d+)((?:\.[A-Za-z_$][\w$]*)*)$/;

/**
 * Compiles a key template once, when the decorator is applied: `'order:{0}'`, `'acct:{0.id}'`,
 * `'{1.tenant}:{0}'`. `{N}` is the N-th argument, `.name` steps into an own property. Text outside
 * braces is literal; a template without placeholders is a fixed key. Malformed templates throw
 * `RedisLockConfigurationError` at once.
 */
export function compileLockKey(source: unknown, method: string): LockKeyResolver {
  if (!Array.isArray(source)) return compileOne(source, method);
  if (source.length === 0) {
    throw new RedisLockConfigurationError(
      `@WithLock(${method}).key`,
      source,
      'must name at least one key',
    );
  }
  const resolvers = source.map((each: unknown) => compileOne(each, method));
  return (args) => resolvers.map((resolve) => resolve(args));
}

/** One key's template or function (see `compileLockKey`). */
function compileOne(source: unknown, method: string): (args: readonly unknown[]) => string {
  const option = `@WithLock(${method}).key`;
  if (typeof source === 'function') {
    const fn = source as (...args: unknown[]) => unknown;
    return (args) => {
      const key = fn(...args);
      if (typeof key !== 'string' || key.length === 0) {
        throw new LockKeyResolutionError(method, '(key function)', '(key function)', key);
      }
      return key;
    };
  }
  if (typeof source !== 'string' || source.length === 0) {
    throw new RedisLockConfigurationError(
      option,
      source,
      'must be a non-empty template string or a function of the arguments',
    );
  }
  const parts = parseTemplate(source, (problem) => {
    throw new RedisLockConfigurationError(option, source, problem);
  });
  return (args) =>
    parts
      .map((part) => (typeof part === 'string' ? part : resolvePart(part, args, method, source)))
      .join('');
}

function parseTemplate(template: string, fail: (problem: string) => never): Part[] {
  const parts: Part[] = [];
  let rest = template;
  while (rest.length > 0) {
    const open = rest.indexOf('{');
    const close = rest.indexOf('}');
    if (close >= 0 && (open < 0 || close < open))
      fail(`a "}" at position ${template.length - rest.length + close} closes nothing`);
    if (open < 0) {
      parts.push(rest);
      break;
    }
    if (open > 0) parts.push(rest.slice(0, open));
    const end = rest.indexOf('}', open);
    if (end < 0) fail('a "{" is never closed');
    const inner = rest.slice(open + 1, end);
    const match = PLACEHOLDER.exec(inner);
    if (!match) {
      fail(
        `"{${inner}}" is not a placeholder: write {N} or {N.property.path}, N being the argument's position`,
      );
    }
    parts.push({
      placeholder: `{${inner}}`,
      index: Number(match[1]),
      path: match[2].split('.').slice(1),
    });
    rest = rest.slice(end + 1);
  }
  return parts;
}

function resolvePart(
  part: Exclude<Part, string>,
  args: readonly unknown[],
  method: string,
  template: string,
): string {
  let value: unknown = args[part.index];
  for (const name of part.path) {
    // Own properties only: a name found on the prototype chain (`constructor`, or one a polluted
    // `Object.prototype` adds) is a missing one, never a shared key.
    if (value === null || value === undefined || !Object.hasOwn(Object(value) as object, name)) {
      value = undefined;
      break;
    }
    value = (value as Record<string, unknown>)[name];
  }
  if (
    (typeof value === 'string' && value.length > 0) ||
    (typeof value === 'number' && Number.isFinite(value)) ||
    typeof value === 'bigint'
  ) {
    return String(value);
  }
  throw new LockKeyResolutionError(method, template, part.placeholder, value);
}
