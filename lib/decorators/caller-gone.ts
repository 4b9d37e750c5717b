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

/** The calls waiting on one endpoint, and what removes its one listener for them all. */
interface Watchers {
  readonly calls: Set<() => void>;
  readonly unlisten: () => void;
}

const watching = new WeakMap<Endpoint, Watchers>();

/**
 * Calls `listener` at the first of `events` on `endpoint`, through one listener per endpoint
 * however many calls wait on it (a WebSocket or TCP connection carries many messages at once: a
 * listener each would grow with them and trip Node's `MaxListenersExceededWarning`). Returns what
 * stops watching; the endpoint's listener goes with the last call that watches it.
 */
function listen(endpoint: Endpoint, events: readonly string[], listener: () => void): () => void {
  let watchers = watching.get(endpoint);
  if (!watchers) {
    const calls = new Set<() => void>();
    const fire = (): void => {
      unlisten();
      for (const call of calls) call();
      calls.clear();
    };
    const unlisten = (): void => {
      if (watching.get(endpoint) === watchers) watching.delete(endpoint);
      for (const event of events) endpoint.off(event, fire);
    };
    watchers = { calls, unlisten };
    watching.set(endpoint, watchers);
    for (const event of events) endpoint.on(event, fire);
  }
  const { calls, unlisten } = watchers;
  calls.add(listener);
  return () => {
    calls.delete(listener);
    if (calls.size === 0) unlisten();
  };
}

/** A signal that aborts when the handler's caller goes, and what stops watching for it. */
export interface CallerWatch {
  readonly signal: AbortSignal;
  readonly stop: () => void;
}

/**
 * Watches the caller of a handler while its lock is waited for: the signal aborts with
 * `CallerGone` when the HTTP response closes unfinished (the client hung up; Express and
 * Fastify), when the WebSocket closes (`ws`: 'close', socket.io: 'disconnect'), or when a TCP
 * microservice connection closes. `undefined` where the transport says nothing of its caller.
 * One listener per endpoint, however many calls wait on it (see `listen`).
 */
export function watchCaller(context: ExecutionContext): CallerWatch | undefined {
  const found = endpointOf(context);
  if (!found) return undefined;
  const { endpoint, events, gone, transport } = found;
  const controller = new AbortController();
  const onGone = (): void => {
    if (!found.finished?.()) controller.abort(new CallerGone(transport));
  };
  if (gone()) {
    onGone();
    return { signal: controller.signal, stop: () => undefined };
  }
  return { signal: controller.signal, stop: listen(endpoint, events, onGone) };
}

function endpointOf(context: ExecutionContext):
  | {
      endpoint: Endpoint;
      events: readonly string[];
      /** Whether the caller is gone already, before any event. */
      gone: () => boolean;
      /** Whether the call was answered (an event that follows an answer is no hang-up). */
      finished?: () => boolean;
      transport: string;
    }
  | undefined {
  switch (context.getType<string>()) {
    case 'http': {
      const reply: unknown = context.switchToHttp().getResponse();
      // Fastify's reply wraps Node's response as `raw`; Express's is Node's response.
      const response = (reply as { raw?: unknown } | undefined)?.raw ?? reply;
      if (!isEndpoint(response) || !('writableFinished' in response)) return undefined;
      const node = response as Endpoint & { writableFinished: boolean; destroyed?: boolean };
      return {
        endpoint: node,
        events: ['close'],
        gone: () => node.destroyed === true && !node.writableFinished,
        // 'close' also follows a response that was sent: only an unfinished one is a hang-up.
        finished: () => node.writableFinished,
        transport: 'HTTP',
      };
    }
    case 'ws': {
      const client: unknown = context.switchToWs().getClient();
      if (!isEndpoint(client)) return undefined;
      const socket = client as Endpoint & { readyState?: number; connected?: boolean };
      return {
        endpoint: socket,
        events: ['close', 'disconnect'],
        // ws: CLOSING (2) or CLOSED (3); socket.io: no longer connected.
        gone: () => (socket.readyState ?? 0) >= 2 || socket.connected === false,
        transport: 'WebSocket',
      };
    }
    case 'rpc': {
      const ctx = context.switchToRpc().getContext<{ getSocketRef?: () => unknown } | undefined>();
      const ref = typeof ctx?.getSocketRef === 'function' ? ctx.getSocketRef() : undefined;
      const socket = (ref as { socket?: unknown } | undefined)?.socket;
      if (!isEndpoint(socket)) return undefined;
      const tcp = socket as Endpoint & { destroyed?: boolean };
      return {
        endpoint: tcp,
        events: ['close'],
        gone: () => tcp.destroyed === true,
        transport: 'microservice',
      };
    }
    default:
      return undefined;
  }
}

function isEndpoint(value: unknown): value is Endpoint {
  return (
    typeof value === 'object' &&
    value !== null &&
    typeof (value as Partial<Endpoint>).on === 'function' &&
    typeof (value as Partial<Endpoint>).off === 'function'
  );
}
