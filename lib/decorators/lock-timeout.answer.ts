import { HttpException, type ExecutionContext } from '@nestjs/common';
import type { HttpAdapterHost } from '@nestjs/core';
import { STATUS_CODES } from 'node:http';
import type { LockAcquireTimeoutError } from '../errors/redis-lock.errors.js';
import type { LockTimeoutResponse } from '../interfaces/with-lock-options.interface.js';

/**
 * The error a handler's lock timeout becomes in its transport: the `timeoutException` if one is
 * set (the decorator's, else the module's), else HTTP `timeoutStatus` (409) with `Retry-After`
 * (set through the platform's adapter, so Express and Fastify alike), an `RpcException`, or a
 * `WsException`; in any other context the error itself. Once the headers are out (an SSE stream
 * that started), no header is set and Nest sends the error as the stream's `error` event. `response` is the decorator's setting if
 * it has one, else the module's.
 */
export async function answerLockTimeout(
  error: LockAcquireTimeoutError,
  context: ExecutionContext,
  response: LockTimeoutResponse,
  adapterHost: HttpAdapterHost | undefined,
): Promise<unknown> {
  if (response.timeoutException) return response.timeoutException(error, context);
  switch (context.getType<string>()) {
    case 'http': {
      const seconds = retryAfterSeconds(error);
      const reply: unknown = context.switchToHttp().getResponse();
      const adapter = adapterHost?.httpAdapter;
      // Not once a stream (SSE) has sent its headers: the error then goes out as an event.
      if (adapter && !adapter.isHeadersSent(reply)) {
        adapter.setHeader(reply, 'Retry-After', String(seconds));
      }
      const status = response.timeoutStatus ?? 409;
      return new HttpException(
        {
          statusCode: status,
          error: STATUS_CODES[status] ?? 'Error',
          message: error.busy
            ? `The resource is busy: another request holds its lock. Retry after ${seconds} s.`
            : `The resource's lock could not be taken in time (Redis answered too late). Retry after ${seconds} s.`,
        },
        status,
        { cause: error },
      );
    }
    case 'rpc': {
      // Loaded on demand: only apps with microservice handlers have @nestjs/microservices.
      const { RpcException } = await import('@nestjs/microservices');
      return new RpcException({
        status: 'error',
        code: 'LOCK_TIMEOUT',
        message: withoutKey(error),
        retryAfterMs: error.retryAfterMs,
      });
    }
    case 'ws': {
      const { WsException } = await import('@nestjs/websockets');
      return new WsException({ status: 'error', code: 'LOCK_TIMEOUT', message: withoutKey(error) });
    }
    default:
      return error;
  }
}

/**
 * A lock timeout as a microservice or WebSocket client is told it: without the key, which came
 * from the message and may hold anything (`timeoutException` can answer with it).
 */
function withoutKey(error: LockAcquireTimeoutError): string {
  return error.busy
    ? `The resource is busy: another holder kept its lock for ${error.acquireTimeout} ms. Retry later.`
    : `The resource's lock could not be taken within ${error.acquireTimeout} ms (Redis answered too late). Retry later.`;
}

/**
 * Seconds a client should wait before retrying, at least 1: how long the key's holds last, as this
 * process saw (never longer than the holder's lock still runs), else the holder's remaining TTL,
 * else `acquireTimeout` — except for a call `maxWaiters` refused, which asked Redis nothing: 1 s
 * (asking again costs the server nothing while the waiters are full).
 */
function retryAfterSeconds(error: LockAcquireTimeoutError): number {
  const ms =
    error.expectedWaitMs ?? error.retryAfterMs ?? (error.queueFull ? 0 : error.acquireTimeout);
  return Math.max(1, Math.ceil(ms / 1_000));
}
