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
  /** Whether the caller is gone already, before any event. */
  readonly gone: (endpoint: Endpoint) => boolean;
  /** Whether the call was answered (an event that follows an answer is no hang-up). */
  readonly finished?: (endpoint: Endpoint) => boolean;
}

type Node = Endpoint & {
  destroyed?: boolean;
  readyState?: number;
  connected?: boolean;
  closed?: boolean;
  headersSent?: boolean;
};

/**
 * An HTTP/1 connection, which its keep-alive (and pipelined) requests share and one hang-up
 * closes.
 */
const HTTP_CONNECTION: Kind = {
  transport: 'HTTP',
  events: ['close'],
  gone: (socket: Node) => socket.destroyed === true,
};
/** An HTTP/2 request's stream, which the client may cancel alone (or with its session). */
const HTTP2_STREAM: Kind = {
  transport: 'HTTP',
  events: ['close'],
  gone: (stream: Node) => stream.destroyed === true || stream.closed === true,
  // A stream closes after its response too: one that closes before its response began is a
  // hang-up, whatever its code (a session closed by the client ends a stream with none).
  finished: (stream: Node) => stream.headersSent === true,
};
const WEB_SOCKET: Kind = {
  transport: 'WebSocket',
  // ws: 'close', socket.io: 'disconnect'.
  events: ['close', 'disconnect'],
  // ws: CLOSING (2) or CLOSED (3); socket.io: no longer connected.
  gone: (socket: Node) => (socket.readyState ?? 0) >= 2 || socket.connected === false,
};
const TCP_CONNECTION: Kind = {
  transport: 'microservice',
  events: ['close'],
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
  // The arguments Nest gives the handler: (request, response, next) over HTTP, (client, data) over
  // WebSocket, (data, context) from a microservice; read as they are (`switchToHttp()` and the
  // like build an object per call).
  switch (context.getType<string>()) {
    case 'http': {
      // The request (Fastify's wraps Node's as `raw`), not the response: a pipelined request's
      // response has no connection until the ones before it are answered.
      type Request = { socket?: unknown; stream?: unknown } | undefined;
      const request = context.getArgByIndex<(Request & { raw?: Request }) | undefined>(0);
      const node = request?.raw ?? request;
      return node?.stream !== undefined
        ? watch(node.stream, HTTP2_STREAM)
        : watch(node?.socket, HTTP_CONNECTION);
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

/**
 * The signal of `endpoint`, made (with its one listener) by its first call while its caller is
 * there; for a caller gone already (a connection closing as its last messages are handled), an
 * aborted signal and nothing left on the endpoint, however many calls come after.
 */
function watch(endpoint: unknown, kind: Kind): AbortSignal | undefined {
  const watched = watching.get(endpoint as object);
  if (watched !== undefined) {
    if (!watched.signal.aborted && kind.gone(endpoint as Endpoint)) {
      watched.abort(new CallerGone(kind.transport));
    }
    return watched.signal;
  }
  if (!isEndpoint(endpoint)) return undefined;
  if (kind.gone(endpoint)) return AbortSignal.abort(new CallerGone(kind.transport));
  const controller = new AbortController();
  watching.set(endpoint, controller);
  const fire = (): void => {
    watching.delete(endpoint);
    for (const event of kind.events) endpoint.off(event, fire);
    if (!kind.finished?.(endpoint)) controller.abort(new CallerGone(kind.transport));
  };
  for (const event of kind.events) endpoint.on(event, fire);
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
