import type { ExecutionContext } from '@nestjs/common';

/**
 * The reason a handler's wait for its lock was cut short: its caller is gone (an HTTP client that
 * hung up, a WebSocket or TCP microservice connection that closed). The call rejects with
 * `LockAcquireAbortedError` whose `cause` is this; nothing was taken.
 */
export class CallerGone extends Error {
  constructor(readonly transport: string) {
    super(`the ${transport} caller went away while its handler waited for the lock`);
    this.name = 'CallerGone';
  }
}

/** What a handler's caller is reached through: Node's emitters (`on`/`off`). */
interface Endpoint {
  on(event: string, listener: () => void): unknown;
  off(event: string, listener: () => void): unknown;
}

/** What one transport's endpoints say of their caller. */
interface Kind {
  readonly transport: string;
  /** The events that say the caller went. */
  readonly events: readonly string[];
  /** Whether `endpoint` is one of this kind (checked once per endpoint). */
  readonly accepts: (endpoint: Endpoint) => boolean;
  /** Whether the caller is gone already, before any event. */
  readonly gone: (endpoint: Endpoint) => boolean;
  /** Whether the call was answered (an event that follows an answer is no hang-up). */
  readonly finished?: (endpoint: Endpoint) => boolean;
}

type Node = Endpoint & {
  destroyed?: boolean;
  writableFinished?: boolean;
  readyState?: number;
  connected?: boolean;
};

/** An HTTP/1 connection, which its keep-alive requests share and one hang-up closes. */
const HTTP_CONNECTION: Kind = {
  transport: 'HTTP',
  events: ['close'],
  accepts: () => true,
  gone: (socket: Node) => socket.destroyed === true,
};
/** An HTTP response of its own (an HTTP/2 stream, which the client may cancel alone). */
const HTTP_RESPONSE: Kind = {
  transport: 'HTTP',
  events: ['close'],
  accepts: (response) => 'writableFinished' in response,
  gone: (response: Node) => response.destroyed === true && !response.writableFinished,
  // 'close' also follows a response that was sent: only an unfinished one is a hang-up.
  finished: (response: Node) => response.writableFinished === true,
};
const WEB_SOCKET: Kind = {
  transport: 'WebSocket',
  // ws: 'close', socket.io: 'disconnect'.
  events: ['close', 'disconnect'],
  accepts: () => true,
  // ws: CLOSING (2) or CLOSED (3); socket.io: no longer connected.
  gone: (socket: Node) => (socket.readyState ?? 0) >= 2 || socket.connected === false,
};
const TCP_CONNECTION: Kind = {
  transport: 'microservice',
  events: ['close'],
  accepts: () => true,
  gone: (socket: Node) => socket.destroyed === true,
};

/** Per endpoint: the signal of every call that waits on it, aborted when its caller goes. */
const watching = new WeakMap<object, AbortController>();

/**
 * A signal that aborts with `CallerGone` when the handler's caller goes: the HTTP connection
 * closes before its response is finished (the client hung up; Express and Fastify), the
 * WebSocket closes (`ws`: 'close', socket.io: 'disconnect'), or the TCP microservice connection
 * closes. `undefined` where the transport says nothing of its caller.
 *
 * One signal, and one listener, per endpoint (a connection; an HTTP/2 stream), made by its first
 * call and shared by every call after it (the requests of a keep-alive connection, the messages
 * of a WebSocket): a signal is the costliest part of a call's watch (Node's `AbortController`,
 * ~6 µs, and a listener on it for each wait), and a connection that closes leaves none of its
 * calls a caller to answer. A call that no longer waits leaves its listener on the signal to the
 * engine, which takes it off when the wait ends; the signal aborting later (the connection
 * closing while the work runs, or after) concerns no lock.
 */
export function callerSignal(context: ExecutionContext): AbortSignal | undefined {
  // The arguments Nest gives the handler: (request, response) over HTTP, (client, data) over
  // WebSocket, (data, context) from a microservice; read as they are (`switchToHttp()` and the
  // like build an object per call).
  switch (context.getType<string>()) {
    case 'http': {
      // Fastify's reply wraps Node's response as `raw`; Express's is Node's response.
      type Response = { socket?: unknown; stream?: unknown } | undefined;
      const reply = context.getArgByIndex<(Response & { raw?: Response }) | undefined>(1);
      const response = reply?.raw ?? reply;
      const connection = response?.stream === undefined ? response?.socket : undefined;
      return connection ? watch(connection, HTTP_CONNECTION) : watch(response, HTTP_RESPONSE);
    }
    case 'ws':
      return watch(context.getArgByIndex(0), WEB_SOCKET);
    case 'rpc': {
      const rpc = context.getArgByIndex<{ getSocketRef?: () => unknown } | undefined>(1);
      const ref = typeof rpc?.getSocketRef === 'function' ? rpc.getSocketRef() : undefined;
      return watch((ref as { socket?: unknown } | undefined)?.socket, TCP_CONNECTION);
    }
    default:
      return undefined;
  }
}

/** The signal of `endpoint`, made (with its one listener) by its first call. */
function watch(endpoint: unknown, kind: Kind): AbortSignal | undefined {
  let controller = watching.get(endpoint as object);
  if (controller === undefined) {
    if (!isEndpoint(endpoint) || !kind.accepts(endpoint)) return undefined;
    const created = (controller = new AbortController());
    watching.set(endpoint, created);
    const fire = (): void => {
      watching.delete(endpoint);
      for (const event of kind.events) endpoint.off(event, fire);
      if (!kind.finished?.(endpoint)) created.abort(new CallerGone(kind.transport));
    };
    for (const event of kind.events) endpoint.on(event, fire);
  }
  if (!controller.signal.aborted && kind.gone(endpoint as Endpoint)) {
    watching.delete(endpoint as object);
    controller.abort(new CallerGone(kind.transport));
  }
  return controller.signal;
}

function isEndpoint(value: unknown): value is Endpoint {
  return (
    typeof value === 'object' &&
    value !== null &&
    typeof (value as Partial<Endpoint>).on === 'function' &&
    typeof (value as Partial<Endpoint>).off === 'function'
  );
}
