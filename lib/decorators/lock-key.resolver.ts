import {
  LockKeyResolutionError,
  RedisLockConfigurationError,
  type KeyView,
} from '../errors/redis-lock.errors.js';
import { isWellFormed } from '../options/checks.js';

/**
 * Builds the lock key (or keys) from a call's arguments; a key longer than `maxKeyLength` (the
 * decorator's, else the module's, which the caller passes) or refused by `validateKey` throws
 * `LockKeyResolutionError`, which shows keys with `view` (the module's `logKeys`).
 */
export type LockKeyResolver = (
  args: readonly unknown[],
  maxKeyLength: number,
  view?: KeyView,
) => string | string[];

/** The decorator's own checks of a built key (see `WithLockOptions`). */
export interface KeyChecks {
  readonly maxKeyLength?: number;
  readonly validateKey?: (key: string, args: readonly unknown[]) => boolean;
}

type Part =
  | string
  | { readonly placeholder: string; readonly index: number; readonly path: readonly string[] };

/** What TypeScript declared of the decorated method's parameters (see `compileLockKey`). */
export interface DeclaredParameters {
  /** `design:paramtypes`: one constructor per parameter (`Object` for any, unknown, unions...). */
  readonly types: readonly unknown[];
  /**
   * Whether `types` counts every argument a call may pass: the method's `length` equals it (no
   * default value and no rest parameter, which `length` stops at; TypeScript gives a rest
   * parameter's element type, so its count says nothing).
   */
  readonly exact: boolean;
}

const PLACEHOLDER = /^(\d+)((?:\.[A-Za-z_$][\w$]*)*)$/;

/**
 * Compiles a key template once, when the decorator is applied: `'order:{0}'`, `'acct:{0.id}'`,
 * `'{1.tenant}:{0}'`. `{N}` is the N-th argument, `.name` steps into an own property. Text outside
 * braces is literal; a template without placeholders is a fixed key. Malformed templates throw
 * `RedisLockConfigurationError` at once.
 *
 * A placeholder's value is percent-encoded (`%XX` per UTF-8 byte) where it has a `%`, a brace, a
 * `:`, a control character, or any other character that is neither a letter nor a digit and
 * appears in the template's own text: a value can never write the template's separators, so two
 * different argument lists never build one key, and a value cannot build a key that another
 * template (or code) writes with those separators (`order:{0}` with `42:refund` is
 * `order:42%3Arefund`, never `order:42:refund`). Two placeholders must be apart by such a
 * separator. Key functions are not encoded: what they return is the key.
 */
export function compileLockKey(
  source: unknown,
  method: string,
  params?: DeclaredParameters,
  checks: KeyChecks = {},
): LockKeyResolver {
  const check = keyCheck(method, checks);
  if (!Array.isArray(source)) {
    const resolve = compileOne(source, method, params);
    return (args, max, view) => check(resolve(args, view), source as string, args, max, view);
  }
  if (source.length === 0) {
    throw new RedisLockConfigurationError(
      `@WithLock(${method}).key`,
      source,
      'must name at least one key',
    );
  }
  const resolvers = source.map((each: unknown) => compileOne(each, method, params));
  // One key named twice (a transfer from an account to itself) is locked once.
  return (args, max, view) => [
    ...new Set(
      resolvers.map((resolve, i) =>
        check(resolve(args, view), source[i] as string, args, max, view),
      ),
    ),
  ];
}

/** The checks of every built key: `maxKeyLength` (the decorator's, else the module's) and `validateKey`. */
function keyCheck(
  method: string,
  { maxKeyLength, validateKey }: KeyChecks,
): (
  key: string,
  source: string,
  args: readonly unknown[],
  moduleMax: number,
  keyView: KeyView | undefined,
) => string {
  return (key, source, args, moduleMax, keyView) => {
    const template = typeof source === 'function' ? '(key function)' : source;
    // Never above the module's, which every key is held to (a request-scoped controller's
    // decorator is not seen by the check at boot).
    const max = Math.min(maxKeyLength ?? moduleMax, moduleMax);
    if (key.length > max) {
      throw new LockKeyResolutionError(
        method,
        template,
        '(whole key)',
        key,
        'too-long',
        max,
        keyView,
      );
    }
    if (validateKey !== undefined && validateKey(key, args) !== true) {
      throw new LockKeyResolutionError(
        method,
        template,
        '(whole key)',
        key,
        'refused',
        undefined,
        keyView,
      );
    }
    return key;
  };
}

/**
 * One key's template or function (see `compileLockKey`); the resolver's `view` is the module's
 * `logKeys`, for its errors.
 */
function compileOne(
  source: unknown,
  method: string,
  params: DeclaredParameters | undefined,
): (args: readonly unknown[], view: KeyView | undefined) => string {
  const option = `@WithLock(${method}).key`;
  if (typeof source === 'function') {
    const fn = source as (...args: unknown[]) => unknown;
    return (args, view) => {
      const key = fn(...args);
      if (typeof key !== 'string' || key.length === 0 || !isWellFormed(key)) {
        throw new LockKeyResolutionError(
          method,
          '(key function)',
          '(key function)',
          key,
          'unresolved',
          undefined,
          view,
        );
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
  const fail = (problem: string): never => {
    throw new RedisLockConfigurationError(option, source, problem);
  };
  const parts = parseTemplate(source, fail);
  checkSeparators(parts, fail);
  if (params !== undefined) {
    checkAgainstParameters(parts, params.types, method, params.exact, fail);
  }
  const encode = encoderFor(parts);
  return (args, view) => {
    let key = '';
    for (const part of parts) {
      key +=
        typeof part === 'string' ? part : encode(resolvePart(part, args, method, source, view));
    }
    return key;
  };
}

/**
 * A character that separates the parts of a key: neither a letter nor a digit, nor `%`, which the
 * encoding itself writes into values.
 */
const SEPARATOR = /[^\p{L}\p{N}%]/u;

/**
 * Between two placeholders there must be a separator (see `compileLockKey`): with `{0}{1}` or
 * `{0}x{1}`, `(1, 23)` and `(12, 3)` would build one key.
 */
function checkSeparators(parts: readonly Part[], fail: (problem: string) => never): void {
  let previous: Exclude<Part, string> | undefined;
  let between = '';
  for (const part of parts) {
    if (typeof part === 'string') {
      between += part;
      continue;
    }
    if (previous !== undefined && !SEPARATOR.test(between)) {
      fail(
        `put a separator such as ":" between ${previous.placeholder} and ${part.placeholder}: without one, two different argument lists can build one key`,
      );
    }
    previous = part;
    between = '';
  }
}

/**
 * The encoding of a template's placeholder values (see `compileLockKey`): `%`, braces, `:`, control
 * characters and the template's own separators become `%XX` per UTF-8 byte.
 */
function encoderFor(parts: readonly Part[]): (value: string) => string {
  const special = new Set(['%', '{', '}', ':']);
  for (const part of parts) {
    if (typeof part !== 'string') continue;
    for (const char of part) if (SEPARATOR.test(char)) special.add(char);
  }
  const escaped = [...special].map((char) => `\\u{${(char.codePointAt(0) ?? 0).toString(16)}}`);
  const pattern = new RegExp(`[${escaped.join('')}\\p{Cc}]`, 'gu');
  return (value) => value.replace(pattern, percentEncode);
}

function percentEncode(char: string): string {
  let out = '';
  for (const byte of Buffer.from(char, 'utf8')) {
    out += `%${byte.toString(16).toUpperCase().padStart(2, '0')}`;
  }
  return out;
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

/** Primitive parameter types, each with a value whose own properties it has. */
const PRIMITIVES = new Map<unknown, unknown>([
  [String, ''],
  [Number, 0],
  [Boolean, false],
  [BigInt, 0n],
]);

/**
 * What the method's declared parameters (`design:paramtypes`, emitted by TypeScript with
 * `emitDecoratorMetadata`, as every Nest app has) tell of a template before any call: a
 * placeholder past the last parameter, or a property read from a string or number parameter,
 * can never make a key. Left alone: the count of a method with a default value or a rest
 * parameter (see `DeclaredParameters.exact`), and parameters whose declared type a route may not
 * keep (`@Query('day') day: Date` is a string without a transforming pipe), so a class-typed
 * parameter used whole is left to the call.
 */
function checkAgainstParameters(
  parts: readonly Part[],
  params: readonly unknown[],
  method: string,
  exact: boolean,
  fail: (problem: string) => never,
): void {
  for (const part of parts) {
    if (typeof part === 'string') continue;
    const { placeholder, index, path } = part;
    if (index >= params.length && exact) {
      fail(
        `${placeholder} reads argument ${index}, but ${method} declares ${params.length} ` +
          `parameter${params.length === 1 ? '' : 's'} (numbered from 0)`,
      );
    }
    const type = params[index];
    if (typeof type !== 'function') continue;
    if (PRIMITIVES.has(type)) {
      if (path.length > 0 && !Object.hasOwn(Object(PRIMITIVES.get(type)) as object, path[0])) {
        fail(
          `${placeholder} reads property "${path[0]}" of parameter ${index}, which is a ` +
            `${type.name.toLowerCase()}: write {${index}}`,
        );
      }
    }
  }
}

function resolvePart(
  part: Exclude<Part, string>,
  args: readonly unknown[],
  method: string,
  template: string,
  view: KeyView | undefined,
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
    (typeof value === 'string' && value.length > 0 && isWellFormed(value)) ||
    (typeof value === 'number' && Number.isFinite(value)) ||
    typeof value === 'bigint'
  ) {
    return String(value);
  }
  throw new LockKeyResolutionError(
    method,
    template,
    part.placeholder,
    value,
    'unresolved',
    undefined,
    view,
  );
}
