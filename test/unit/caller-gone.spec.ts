import assert from 'node:assert/strict';
import { EventEmitter } from 'node:events';
import { describe, it } from 'node:test';
import type { ExecutionContext } from '@nestjs/common';
import { CallerGone, callerSignal } from '../../lib/decorators/caller-gone.js';
import { listeners } from '../support/listeners.js';

/** A handler's execution context with `args`, as Nest gives it on `type`'s transport. */
function contextOf(type: string, args: unknown[]): ExecutionContext {
  return {
    getType: () => type,
    getArgByIndex: (index: number) => args[index],
  } as unknown as ExecutionContext;
}

/** A connection: an emitter with the state Node's sockets and `ws` clients have. */
function endpoint(state: Record<string, unknown> = {}): EventEmitter & Record<string, unknown> {
  return Object.assign(new EventEmitter(), state);
}

describe('a handler caller watch (callerSignal)', () => {
  it('one signal and one listener per connection, however many calls it carries; its close aborts it with CallerGone and takes the listener off', () => {
    const socket = endpoint({ destroyed: false });
    const request = { socket };
    const signals = Array.from({ length: 20 }, () =>
      callerSignal(contextOf('http', [request, {}, () => undefined])),
    );
    assert.ok(signals[0] instanceof AbortSignal);
    assert.ok(
      signals.every((signal) => signal === signals[0]),
      'one signal for them all',
    );
    assert.equal(socket.listenerCount('close'), 1);
    assert.equal(signals[0].aborted, false);
    socket.emit('close');
    assert.equal(signals[0].aborted, true);
    assert.ok(signals[0].reason instanceof CallerGone);
    assert.equal(signals[0].reason.transport, 'HTTP');
    assert.equal(listeners(socket), 0, 'nothing left on the closed connection');
  });

  it('a caller gone already gets an aborted signal, and nothing is left on its connection, however many calls come (ws, TCP, HTTP)', () => {
    const cases = [
      ['ws', endpoint({ readyState: 2 }), (client: unknown) => [client, {}]],
      [
        'rpc',
        endpoint({ destroyed: true }),
        (socket: unknown) => [{}, { getSocketRef: () => ({ socket }) }],
      ],
      ['http', endpoint({ destroyed: true }), (socket: unknown) => [{ socket }, {}]],
    ] as const;
    for (const [type, gone, args] of cases) {
      for (let call = 0; call < 20; call++) {
        const signal = callerSignal(contextOf(type, args(gone)));
        assert.equal(signal?.aborted, true, `${type}: aborted`);
        assert.ok(signal.reason instanceof CallerGone, `${type}: CallerGone`);
      }
      assert.equal(listeners(gone), 0, `${type}: no listener on a connection already gone`);
    }
  });

  it('a connection that starts closing while its signal is in use aborts it at the next call, before its event', () => {
    const client = endpoint({ readyState: 1 });
    const first = callerSignal(contextOf('ws', [client, {}]));
    assert.equal(first?.aborted, false);
    client.readyState = 2; // CLOSING: its 'close' comes later
    const second = callerSignal(contextOf('ws', [client, {}]));
    assert.equal(second, first);
    assert.equal(first.aborted, true);
    assert.equal(client.listenerCount('close') + client.listenerCount('disconnect'), 2);
    client.emit('close');
    assert.equal(listeners(client), 0);
  });

  it('HTTP/2: a stream of its own; closed before its response began is a hang-up, after it is not', () => {
    const session = endpoint({ destroyed: false });
    const cut = endpoint({ destroyed: false, closed: false, headersSent: false });
    const answered = endpoint({ destroyed: false, closed: false, headersSent: false });
    const [a, b] = [cut, answered].map((stream) =>
      callerSignal(contextOf('http', [{ raw: { stream, socket: session } }, {}])),
    );
    assert.notEqual(a, b, 'a signal per stream');
    assert.equal(listeners(session), 0, 'not the session');
    answered.headersSent = true;
    answered.emit('close');
    cut.emit('close'); // a cancel, or the session closed: no response was begun
    assert.equal(b?.aborted, false, 'a stream that closes after its response is no hang-up');
    assert.equal(a?.aborted, true);
    assert.ok(a.reason instanceof CallerGone);
  });

  it('no watch where the transport says nothing of its caller', () => {
    assert.equal(callerSignal(contextOf('http', [{}, {}])), undefined);
    assert.equal(callerSignal(contextOf('rpc', [{}, {}])), undefined);
    assert.equal(callerSignal(contextOf('graphql', [{}, {}])), undefined);
  });
});
