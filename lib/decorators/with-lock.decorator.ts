import {
  createParamDecorator,
  Inject,
  Logger,
  Optional,
  BadRequestException,
  HttpException,
  ServiceUnavailableException,
  type ExecutionContext,
} from '@nestjs/common';
import { HttpAdapterHost } from '@nestjs/core';
import { from, isObservable, mergeMap, Observable, of, type Subscription } from 'rxjs';
import {
  LockAcquireAbortedError,
  LockAcquireTimeoutError,
  LockBackendError,
  LockKeyResolutionError,
  RedisLockConfigurationError,
} from '../errors/redis-lock.errors.js';
import type { AcquireOptions } from '../interfaces/lock.interface.js';
import type { LockKeySource, WithLockOptions } from '../interfaces/with-lock-options.interface.js';
import type { LockService } from '../lock.service.js';
import { SKIP_WHEN_BUSY } from '../options/acquire-options.js';
import { DEFAULT_MAX_KEY_LENGTH } from '../options/defaults.js';
import { validateWithLockOptions } from '../options/decorator-options.js';
import { OutageLog } from '../utils/outage-log.js';
import { CallerGone, callerSignal } from './caller-gone.js';
import { answerLockTimeout } from './lock-timeout.answer.js';
import { injectLockService, lockServiceOf, refuseStatic } from './lock-service.injection.js';
import { compileLockKey, type LockKeyResolver } from './lock-key.resolver.js';

const logger = new Logger('RedisLock');

/** Nest's `@Sse()` marker (the same in NestJS 11 and 12): SSE handlers return an Observable. */
const NEST_SSE_METADATA = '__sse__';

/** Where Nest injects the app's HttpAdapterHost (to set `Retry-After`), if the app has one. */
const ADAPTER_HOST = Symbol('nestjs-redis-lock:HttpAdapterHost');

/**
 * Nest's metadata of a method's parameter decorators, on its class (`ROUTE_ARGS_METADATA` in
 * `@nestjs/common/constants`: the same key for HTTP, microservice and WebSocket handlers).
 */
const ROUTE_ARGS_METADATA = '__routeArguments__';

/**
 * What Nest passes a decorated handler after its own arguments, through a parameter decorator of
 * ours: the call's execution context, wrapped in a function (a token). The wrapper takes it off
 * before anything sees the arguments and, with it, turns a lock timeout into the transport's
 * answer (see `answerLockTimeout`). A function, not an object: a global pipe that walks the
 * arguments' objects (to trim or sanitise them) finds nothing in it to walk, and keeps it as it is.
 * Code cannot make one, so a call from code gets `LockAcquireTimeoutError`. Cheaper than an
 * interceptor, which makes Nest run its rxjs pipeline on every request (measured: ~30 µs per
 * request on the benchmark's route).
 */
type HandlerCall = () => ExecutionContext;
const handlerCalls = new WeakSet<HandlerCall>();
/** On a class's prototype, per method name: `@WithLock` decorated it there, with this `onBusy`. */
const LOCKED_METHOD = Symbol('nestjs-redis-lock:locked-method');

/** What `LOCKED_METHOD` records of a `@WithLock` method, for the checks when the app starts. */
interface LockedMethod {
  readonly onBusy: 'fail' | 'skip';
  readonly ttl: number | undefined;
  readonly holdAtLeast: number | undefined;
  readonly maxKeyLength: number | undefined;
}
/** `@nestjs/schedule`'s mark of a `@Cron`, `@Interval` or `@Timeout` method. */
const SCHEDULER_TYPE = 'SCHEDULER_TYPE';
/** Per handler function Nest calls: whether it is a locked method (see `lockedHandler`). */
const lockedHandlers = new WeakMap<object, boolean>();

/**
 * @internal Warns, once per method, about `@WithLock` on a `@nestjs/schedule` job (`@Cron`,
 * `@Interval`, `@Timeout`) of `instance` without `onBusy: 'skip'`: every instance then runs every
 * fire in turn, one after another, which is seldom what a job wants (ShedLock's users read the
 * third argument of `@WithLock(key, ttl, acquireTimeout)` as a hold-at-least, which it is not).
 */
export function warnAboutUnskippedJobs(instance: object, logger: Logger): void {
  for (const [proto, key, locked, method] of lockedMethodsOf(instance)) {
    if (locked.onBusy !== 'fail') continue;
    if (Reflect.getMetadata(SCHEDULER_TYPE, method) === undefined || warned.has(method)) continue;
    warned.add(method);
    logger.warn(
      `@WithLock on the scheduled job ${proto.constructor.name}.${String(key)} has no onBusy: 'skip': every instance will run every fire, one after another, waiting for the lock. For a job that runs once per fire across the fleet, add onBusy: 'skip' (and holdAtLeast: a little more than the spread of your instances' timers).`,
    );
  }
}

/**
 * @internal Refuses, when the app starts, a `@WithLock` method of `instance` whose options only
 * the module's make wrong, which would otherwise fail at every call (a job at every fire): a
 * `holdAtLeast` above the module's `defaults.ttl` the method locks with (its own `ttl` is checked
 * when the class is defined), a `maxKeyLength` above the module's (which every key is held to).
 */
export function checkLockedMethods(
  instance: object,
  module: { readonly defaultTtl: number; readonly maxKeyLength: number },
): void {
  for (const [proto, key, locked] of lockedMethodsOf(instance)) {
    const { holdAtLeast, ttl, maxKeyLength } = locked;
    const where = `@WithLock(${proto.constructor.name}.${String(key)})`;
    if (ttl === undefined && holdAtLeast !== undefined && holdAtLeast > module.defaultTtl) {
      throw new RedisLockConfigurationError(
        `${where}.holdAtLeast`,
        holdAtLeast,
        `must not exceed the ttl the method locks with: the module's defaults.ttl (${module.defaultTtl} ms), as it gives no ttl of its own. Give it a ttl of at least ${holdAtLeast} ms, or a shorter holdAtLeast`,
      );
    }
    if (maxKeyLength !== undefined && maxKeyLength > module.maxKeyLength) {
      throw new RedisLockConfigurationError(
        `${where}.maxKeyLength`,
        maxKeyLength,
        `must not exceed the module's maxKeyLength (${module.maxKeyLength}), which every key is held to: raise the module's, or give this method a lower one`,
      );
    }
  }
}

/** The `@WithLock` methods of `instance`'s class chain: where, the name, the record, the function. */
function* lockedMethodsOf(
  instance: object,
): Generator<[object, string | symbol, LockedMethod, object]> {
  for (
    let proto = Object.getPrototypeOf(instance) as object | null;
    proto && proto !== Object.prototype;
    proto = Object.getPrototypeOf(proto) as object | null
  ) {
    for (const key of Reflect.ownKeys(proto)) {
      const locked = Reflect.getOwnMetadata(LOCKED_METHOD, proto, key) as LockedMethod | undefined;
      const method = Object.getOwnPropertyDescriptor(proto, key)?.value as unknown;
      if (locked !== undefined && typeof method === 'function') {
        yield [proto, key, locked, method];
      }
    }
  }
}
const warned = new WeakSet<object>();

/**
 * Makes the token, for a locked handler only: a subclass's override of one (with the same
 * parameter metadata, which Nest reads through the class chain) gets `undefined` instead.
 */
function handlerCallOf(_data: unknown, context: ExecutionContext): HandlerCall | undefined {
  if (!lockedHandler(context)) return undefined;
  const call: HandlerCall = () => context;
  handlerCalls.add(call);
  return call;
}

/**
 * Whether the handler Nest calls is a method `@WithLock` decorated: found where the class chain
 * defines it, so that a decorator of yours that wraps it from above (tracing, logging) keeps it
 * locked, and an override in a subclass without `@WithLock` is not. Once per handler.
 */
function lockedHandler(context: ExecutionContext): boolean {
  const handler = context.getHandler();
  let locked = lockedHandlers.get(handler);
  if (locked === undefined) {
    locked = true; // not found on its class (a transport that calls something else): as before
    const chain = (context.getClass() as { prototype?: object } | undefined)?.prototype;
    for (
      let proto = chain;
      proto && proto !== Object.prototype;
      proto = Object.getPrototypeOf(proto) as object
    ) {
      const key = Reflect.ownKeys(proto).find(
        (name) => Object.getOwnPropertyDescriptor(proto, name)?.value === handler,
      );
      if (key === undefined) continue;
      locked = Reflect.getOwnMetadata(LOCKED_METHOD, proto, key) !== undefined;
      break;
    }
    lockedHandlers.set(handler, locked);
  }
  return locked;
}
const HandlerCallParameter = createParamDecorator(handlerCallOf);

/** Nest's record of one parameter decorator (`assignCustomParameterMetadata`). */
interface ParameterMetadata {
  readonly index: number;
  readonly factory?: unknown;
}

/** A decorated method, with its arguments (the handler's context taken off) and that context. */
type LockedCall = (
  this: object,
  args: unknown[],
  context: ExecutionContext | undefined,
  job?: OutageLog,
) => unknown;

/**
 * Runs the method while holding a distributed lock whose key comes from the method's arguments,
 * on controller handlers (HTTP on Express and Fastify, microservice, WebSocket) and on provider
 * methods called from code alike. The lock is auto-extended while the method runs and released
 * when its promise settles, or, for a method declared to return an `Observable`, taken when the
 * Observable is subscribed and released when it completes, errors or is unsubscribed.
 *
 * The method must belong to a class Nest instantiates in a module where `LockService` is
 * available (`RedisLockModule` imported there or registered with `isGlobal`). Decorated methods
 * return a Promise (or the declared Observable). Options are checked here, when the class is
 * defined: a bad duration or template throws `RedisLockConfigurationError` at once.
 *
 * On handlers, a lock not acquired within `acquireTimeout` answers HTTP 409 with `Retry-After`
 * (see `timeoutStatus` / `timeoutException`), an `RpcException` or a `WsException`; called from
 * code, it throws `LockAcquireTimeoutError`. Other errors pass through unchanged.
 * @example
 * \@Post(':id/pay')
 * \@WithLock({ key: 'order:{0}', ttl: 10_000, acquireTimeout: 2_000 })
 * pay(@Param('id') id: string, @Body() dto: PayDto) { ... }
 */
export function WithLock(options: WithLockOptions): MethodDecorator;
/**
 * The short form: `@WithLock(key, ttl?, acquireTimeout?)` is `@WithLock({ key, ttl, acquireTimeout })`
 * (an omitted or `undefined` duration takes the module's default). Same key syntax, same checks.
 * @example
 * \@WithLock('order:{0}', 10_000, 2_000)
 */
export function WithLock(
  key: LockKeySource | readonly LockKeySource[],
  ttl?: number,
  acquireTimeout?: number,
): MethodDecorator;
export function WithLock(
  optionsOrKey: WithLockOptions | LockKeySource | readonly LockKeySource[],
  ...durations: unknown[]
): MethodDecorator {
  return (target, propertyKey, descriptor) => {
    const method = `${target.constructor.name}.${String(propertyKey)}`;
    const options = withLockOptions(optionsOrKey, durations, method);
    validateWithLockOptions(options, method);
    const original: unknown = descriptor.value;
    if (typeof original !== 'function') {
      throw new RedisLockConfigurationError(
        `@WithLock(${method})`,
        original,
        'can only decorate a method',
      );
    }
    const types = declaredParameterTypes(target, propertyKey);
    const resolveKey = compileLockKey(
      options.key,
      method,
      types && { types, exact: (original as () => unknown).length === types.length },
      options,
    );
    refuseStatic(target, `@WithLock(${method})`);
    if (/^\[object (Async)?GeneratorFunction\]$/.test(Object.prototype.toString.call(original))) {
      throw new RedisLockConfigurationError(
        `@WithLock(${method})`,
        'a generator',
        ITERATOR_PROBLEM,
      );
    }
    const skip = options.onBusy === 'skip';
    const acquireOptions: CallOptions = {
      ttl: options.ttl,
      // A job that skips when busy does not wait for the instance that runs it.
      acquireTimeout: options.acquireTimeout ?? (skip ? 0 : undefined),
      autoExtend: options.autoExtend,
      limit: options.limit,
      mode: options.mode,
      fair: options.fair,
      holdAtLeast: options.holdAtLeast,
      [SKIP_WHEN_BUSY]: skip,
    };
    const call = original as (...args: unknown[]) => unknown;
    const declared = declaredReturnType(target, propertyKey, method);
    // Parameter decorators are applied before method decorators: these are all of the method's,
    // and, on an override, its base method's (Nest reads them through the class chain), less the
    // base's own `HandlerCall`, which the override's metadata is written without.
    const own = Object.entries(
      (Reflect.getMetadata(ROUTE_ARGS_METADATA, target.constructor, propertyKey) ?? {}) as Record<
        string,
        ParameterMetadata
      >,
    ).filter(([, { factory }]) => factory !== handlerCallOf);
    Reflect.defineMetadata(
      ROUTE_ARGS_METADATA,
      Object.fromEntries(own),
      target.constructor,
      propertyKey,
    );
    const parameters = own.map(([, { index }]) => index);
    const answer = timeoutAnswer(options, method);
    const onCall = lockOnCall(call, method, resolveKey, acquireOptions, answer, skip);
    const onSubscribe = lockOnSubscribe(call, method, resolveKey, acquireOptions, answer, skip);
    // Decided at the first call, when every decorator (whatever its order) has left its metadata.
    let observable: boolean | undefined;
    /** A scheduled job that skips when busy: its outages, logged once each (see `skipWhenBusy`). */
    let job: OutageLog | null | undefined;
    const wrapper = function (this: object, ...args: unknown[]): unknown {
      observable ??=
        declared === 'observable' || Reflect.getMetadata(NEST_SSE_METADATA, wrapper) === true;
      job ??=
        skip && Reflect.getMetadata(SCHEDULER_TYPE, wrapper) !== undefined
          ? new OutageLog(logger, `The scheduled job ${method}`)
          : null;
      let context: ExecutionContext | undefined;
      const last = args[args.length - 1];
      if (typeof last === 'function' && handlerCalls.has(last as HandlerCall)) {
        context = (last as HandlerCall)();
        args.pop();
        // A handler without parameter decorators of its own gets what Nest gives one: nothing
        // over HTTP, the transport's arguments elsewhere (`(data, context)` for a microservice).
        if (parameters.length === 0) args = context.getType() === 'http' ? [] : context.getArgs();
      }
      return (observable ? onSubscribe : onCall).call(this, args, context, job ?? undefined);
    };

    // Decorators listed below this one have put their metadata on the original function.
    for (const metadataKey of Reflect.getOwnMetadataKeys(original)) {
      Reflect.defineMetadata(metadataKey, Reflect.getOwnMetadata(metadataKey, original), wrapper);
    }
    Object.defineProperty(wrapper, 'name', { value: call.name });
    const record: LockedMethod = {
      onBusy: options.onBusy ?? 'fail',
      ttl: options.ttl,
      holdAtLeast: options.holdAtLeast,
      maxKeyLength: options.maxKeyLength,
    };
    Reflect.defineMetadata(LOCKED_METHOD, record, target, propertyKey);
    descriptor.value = wrapper as never;
    // After every declared parameter: `length` stops at the first one with a default value, the
    // declared types (emitted by TypeScript) do not.
    const declaredTypes = Reflect.getMetadata('design:paramtypes', target, propertyKey) as
      unknown[] | undefined;
    HandlerCallParameter()(
      target,
      propertyKey,
      Math.max(call.length, declaredTypes?.length ?? 0, ...parameters.map((index) => index + 1)),
    );
    injectLockService(target);
    Inject(HttpAdapterHost)(target, ADAPTER_HOST);
    Optional()(target, ADAPTER_HOST);
    return descriptor;
  };
}

/** What every call of a `@WithLock` method locks with (its signal aside): the same every call. */
type CallOptions = {
  [K in 'ttl' | 'acquireTimeout' | 'autoExtend' | 'limit' | 'mode' | 'fair' | 'holdAtLeast']:
    AcquireOptions[K] | undefined;
} & { [SKIP_WHEN_BUSY]: boolean };

/**
 * A call's options with its signal, written out rather than spread: V8 (Node 20) gives
 * `{ ...options, signal }` a shape of its own each time (~1.5 µs), and every read of it after
 * is slow (measured: checking a call's options took 6 µs with the spread, 0.2 µs with this).
 */
function withSignal(options: CallOptions, signal: AbortSignal): AcquireOptions {
  return {
    ttl: options.ttl,
    acquireTimeout: options.acquireTimeout,
    autoExtend: options.autoExtend,
    limit: options.limit,
    mode: options.mode,
    fair: options.fair,
    holdAtLeast: options.holdAtLeast,
    [SKIP_WHEN_BUSY]: options[SKIP_WHEN_BUSY],
    signal,
  } as AcquireOptions;
}

/**
 * The method's declared parameter types (`design:paramtypes`), when TypeScript emitted them
 * (`emitDecoratorMetadata`, on in every Nest app) and reflect-metadata is loaded (Nest loads it).
 */
function declaredParameterTypes(
  target: object,
  key: string | symbol,
): readonly unknown[] | undefined {
  const reflect = Reflect as unknown as {
    getMetadata?: (name: string, target: object, key: string | symbol) => unknown;
  };
  const types = reflect.getMetadata?.('design:paramtypes', target, key);
  return Array.isArray(types) ? types : undefined;
}

/** The options object of either form of `@WithLock`. */
function withLockOptions(
  optionsOrKey: WithLockOptions | LockKeySource | readonly LockKeySource[],
  durations: unknown[],
  method: string,
): WithLockOptions {
  const shortForm =
    typeof optionsOrKey === 'string' ||
    typeof optionsOrKey === 'function' ||
    Array.isArray(optionsOrKey);
  if (!shortForm && durations.length > 0) {
    throw new RedisLockConfigurationError(
      `@WithLock(${method})`,
      durations,
      'give either an options object or (key, ttl?, acquireTimeout?), not both',
    );
  }
  if (!shortForm) return optionsOrKey as WithLockOptions;
  if (durations.length > 2) {
    throw new RedisLockConfigurationError(
      `@WithLock(${method})`,
      durations,
      'the short form takes (key, ttl?, acquireTimeout?): use the options object for more',
    );
  }
  const [ttl, acquireTimeout] = durations as [number | undefined, number | undefined];
  return {
    key: optionsOrKey as LockKeySource | readonly LockKeySource[],
    ...(ttl !== undefined && { ttl }),
    ...(acquireTimeout !== undefined && { acquireTimeout }),
  };
}

/**
 * Rejects with what a lock timeout on the handler answers (see `answerLockTimeout`: the decorator's
 * `timeoutStatus` / `timeoutException` if it has one, else the module's), and with any other error
 * as it is.
 */
type TimeoutAnswer = (
  instance: object,
  error: unknown,
  context: ExecutionContext,
) => Promise<never>;

function timeoutAnswer(options: WithLockOptions, method: string): TimeoutAnswer {
  const own = options.timeoutStatus !== undefined || options.timeoutException !== undefined;
  return async (instance, error, context) => {
    if (error instanceof LockAcquireAbortedError && error.cause instanceof CallerGone) {
      throw await callerGone(error, context);
    }
    if (context.getType() === 'http') {
      if (error instanceof LockBackendError) throw unavailable(error);
      if (error instanceof LockKeyResolutionError) throw badKey(error);
    }
    if (!(error instanceof LockAcquireTimeoutError)) throw error;
    // A test double of LockService may have no `timeoutResponse`: the defaults then.
    const response = own
      ? options
      : (lockServiceOf(instance, '@WithLock', method).timeoutResponse ?? {});
    const adapterHost = (instance as { [ADAPTER_HOST]?: HttpAdapterHost })[ADAPTER_HOST];
    throw await answerLockTimeout(error, context, response, adapterHost);
  };
}

/**
 * What a handler whose caller went away while it waited answers, to nobody: HTTP 499 (nginx's
 * "client closed request"), an `RpcException` or a `WsException` with code `CALLER_GONE`, errors
 * Nest's filters send without logging them as failures (a flood of hang-ups logs nothing).
 */
async function callerGone(
  error: LockAcquireAbortedError,
  context: ExecutionContext,
): Promise<unknown> {
  const message = 'The caller went away while the lock was waited for; nothing was done.';
  switch (context.getType<string>()) {
    case 'http':
      return new HttpException({ statusCode: 499, error: 'Client Closed Request', message }, 499, {
        cause: error,
      });
    case 'rpc': {
      const { RpcException } = await import('@nestjs/microservices');
      return new RpcException({ status: 'error', code: 'CALLER_GONE', message });
    }
    default: {
      const { WsException } = await import('@nestjs/websockets');
      return new WsException({ status: 'error', code: 'CALLER_GONE', message });
    }
  }
}

/**
 * What an HTTP handler answers whose lock key could not be built from the request: 400, saying
 * which part, never the key or the value (they came from the request and may be anything); the
 * `LockKeyResolutionError` is its `cause`.
 */
function badKey(error: LockKeyResolutionError): BadRequestException {
  return new BadRequestException(
    {
      statusCode: 400,
      error: 'Bad Request',
      message:
        error.reason === 'too-long'
          ? `The request names a resource whose lock key is too long (${(error.value as string).length} characters, at most ${error.maxKeyLength}).`
          : error.reason === 'refused'
            ? 'The request names a resource that cannot be locked.'
            : error.placeholder.startsWith('{')
              ? `The request does not name the resource to lock: ${error.placeholder} of the lock key is missing or not a string or number.`
              : 'The request does not name the resource to lock.',
    },
    { cause: error },
  );
}

/**
 * What an HTTP handler whose lock could not reach Redis answers: 503, the service is unavailable
 * (not busy: that is the 409), with what went wrong; the `LockBackendError` is its `cause`.
 */
function unavailable(error: LockBackendError): ServiceUnavailableException {
  return new ServiceUnavailableException(
    {
      statusCode: 503,
      error: 'Service Unavailable',
      // Not the error's message: it names the key, which may come from the request.
      message: `The lock service is unavailable: Redis ${error.timedOut ? 'did not answer in time' : 'failed'} during ${error.operation} (${causeOf(error)}). Retry later.`,
    },
    { cause: error },
  );
}

/** What went wrong in Redis, in a few words (the cause's first line, cut at 200 characters). */
function causeOf(error: LockBackendError): string {
  const cause = error.cause instanceof Error ? error.cause.message : String(error.cause);
  const line = cause.split(/[\r\n]/, 1)[0].replace(/\.+$/, '');
  return line.length > 200 ? `${line.slice(0, 200)}…` : line;
}

/**
 * Builds a call's key (`resolveKey`) with the module's `maxKeyLength` and `logKeys` (a test
 * double of `LockService` may have neither: the defaults then).
 */
function keyOfCall(
  locks: Partial<Pick<LockService, 'maxKeyLength' | 'keyView'>>,
  resolveKey: LockKeyResolver,
  args: readonly unknown[],
): string | string[] {
  return resolveKey(args, locks.maxKeyLength ?? DEFAULT_MAX_KEY_LENGTH, locks.keyView);
}

/** Promise methods: the lock is taken when the method is called, through `LockService.using()`. */
function lockOnCall(
  call: (...args: unknown[]) => unknown,
  method: string,
  resolveKey: LockKeyResolver,
  acquireOptions: CallOptions,
  answer: TimeoutAnswer,
  skip: boolean,
): LockedCall {
  const locked = async function (
    this: object,
    args: unknown[],
    started: { ran: boolean },
    signal: AbortSignal | undefined,
  ): Promise<unknown> {
    const locks = lockServiceOf(this, '@WithLock', method);
    return locks.using(
      keyOfCall(locks, resolveKey, args),
      async () => {
        started.ran = true;
        // Awaited here so that a Promise of an Observable is caught as well.
        const result: unknown = await call.apply(this, args);
        if (isObservable(result)) {
          throw new RedisLockConfigurationError(
            `@WithLock(${method})`,
            result,
            'returned an Observable without declaring it: annotate the return type as Observable<T>, with Observable imported as a value (not `import type`), so that the lock is taken when it is subscribed and held until it completes',
          );
        }
        if (isIterator(result)) {
          throw new RedisLockConfigurationError(
            `@WithLock(${method})`,
            'an async iterable or a generator',
            ITERATOR_PROBLEM,
          );
        }
        return result;
      },
      signal ? withSignal(acquireOptions, signal) : acquireOptions,
    );
  };
  return function (args, context, job) {
    const started = { ran: false };
    // A handler's wait ends when its caller goes (see `callerSignal`).
    let pending = locked.call(this, args, started, context && callerSignal(context));
    if (skip) {
      pending = pending.then(
        (result) => {
          job?.recovered();
          return result;
        },
        (error: unknown) => skipWhenBusy(error, started.ran, method, job),
      );
    }
    return context ? pending.catch((error: unknown) => answer(this, error, context)) : pending;
  };
}

/**
 * `onBusy: 'skip'`: a call whose own lock was taken by another holder (the method never ran)
 * resolves `undefined`, said at debug level; any other failure passes on: a Redis that does not
 * answer, a lock nobody else held but that came too late (`busy: false`), or a lock timeout from
 * inside the method. Except for a scheduled job's fire (`job`) whose lock could not reach Redis:
 * the scheduler would log each fire's error with its stack, so the outage is logged once when it
 * starts, summarised while it lasts and ended with a line (`OutageLog`), and the fire resolves
 * `undefined`, not run.
 */
function skipWhenBusy(
  error: unknown,
  ran: boolean,
  method: string,
  job: OutageLog | undefined,
): undefined {
  if (!ran && job && error instanceof LockBackendError) {
    job.failed(error, 'its fires are not run while its lock cannot reach Redis');
    return undefined;
  }
  job?.recovered(); // its lock reached Redis: the method ran (and threw), or the key was busy
  if (ran || !(error instanceof LockAcquireTimeoutError) || !error.busy) throw error;
  // The key is in the `skipped` event (as the module's `logKeys` shows keys).
  logger.debug(`${method} skipped: its lock is held by another holder`);
  return undefined;
}

/**
 * Observable methods: nothing happens until subscription. Then the lock is taken (through the same
 * `using()`), the method is called and its Observable relayed; completion, error or unsubscription
 * ends the hold. An Observable nobody subscribes to never takes a lock.
 */
function lockOnSubscribe(
  call: (...args: unknown[]) => unknown,
  method: string,
  resolveKey: LockKeyResolver,
  acquireOptions: CallOptions,
  answer: TimeoutAnswer,
  skip: boolean,
): LockedCall {
  return function (args, context) {
    return new Observable<unknown>((subscriber) => {
      const unsubscribed = new AbortController();
      let inner: Subscription | undefined;
      let endHold: (() => void) | undefined;
      const hold = (): Promise<void> =>
        new Promise<void>((resolve, reject) => {
          endHold = resolve;
          if (unsubscribed.signal.aborted) return resolve();
          inner = streamOf(call.apply(this, args)).subscribe({
            next: (value) => subscriber.next(value),
            error: reject,
            complete: resolve,
          });
        });
      let held = Promise.resolve().then(() => {
        const locks = lockServiceOf(this, '@WithLock', method);
        return locks.using(
          keyOfCall(locks, resolveKey, args),
          hold,
          withSignal(acquireOptions, unsubscribed.signal),
        );
      });
      // Skipped: completes empty (`endHold` is set once the method was called).
      if (skip)
        held = held.catch((error: unknown) => skipWhenBusy(error, !!endHold, method, undefined));
      (context ? held.catch((error: unknown) => answer(this, error, context)) : held).then(
        () => subscriber.complete(),
        (error: unknown) => subscriber.error(error),
      );
      return () => {
        unsubscribed.abort();
        try {
          inner?.unsubscribe();
        } finally {
          // A teardown that throws still ends the hold (its error goes to whoever unsubscribed).
          endHold?.();
        }
      };
    });
  };
}

/**
 * What an Observable method's call gives, as one stream: its Observable, or, from an `async`
 * method (an `async` `@Sse()` handler returns a Promise of its Observable), the Observable its
 * Promise resolves to, relayed event by event rather than emitted as one value.
 */
function streamOf(result: unknown): Observable<unknown> {
  if (!isPromiseLike(result)) return from(result as Observable<unknown>);
  return from(result).pipe(mergeMap((value) => (isObservable(value) ? value : of(value))));
}

/**
 * Why a generator or an iterator result is refused: the lock would be released when the method
 * returns, before a value is asked for, and the iteration would run unlocked.
 */
const ITERATOR_PROBLEM =
  'a lock cannot be held across the iterations of a generator, an async iterable or a stream: it would be released when the method returns, before the first value is asked for, and the iteration would run unlocked. Consume it inside the locked method, take the lock inside the generator (`LockService.using()` around each piece of work), or return an Observable (declared as such), which holds the lock until it completes';

/** An async iterable (an async generator's object, a stream) or a generator's object. */
function isIterator(value: unknown): boolean {
  if (typeof value !== 'object' || value === null) return false;
  return (
    typeof (value as { [Symbol.asyncIterator]?: unknown })[Symbol.asyncIterator] === 'function' ||
    Object.prototype.toString.call(value) === '[object Generator]'
  );
}

function isPromiseLike(value: unknown): value is PromiseLike<unknown> {
  return typeof (value as PromiseLike<unknown> | undefined)?.then === 'function';
}

/**
 * What the method declares it returns. Observable (imported as a value) means lock on subscribe;
 * Promise, nothing, or a type TypeScript cannot emit (`Function` for a type-only import) mean lock
 * on call; anything else is a synchronous method, which a lock would silently make asynchronous.
 */
function declaredReturnType(
  target: object,
  propertyKey: string | symbol,
  method: string,
): 'observable' | 'other' {
  const type: unknown = Reflect.getMetadata('design:returntype', target, propertyKey);
  if (type === Observable || (typeof type === 'function' && type.prototype instanceof Observable)) {
    return 'observable';
  }
  if (type === undefined || type === Object || type === Function || type === Promise)
    return 'other';
  throw new RedisLockConfigurationError(
    `@WithLock(${method})`,
    type,
    'a locked method runs asynchronously: declare it async (returning a Promise) or returning an Observable',
  );
}
