import {
  HttpException,
  Injectable,
  Optional,
  type CallHandler,
  type ExecutionContext,
  type NestInterceptor,
} from '@nestjs/common';
import { HttpAdapterHost } from '@nestjs/core';
import { STATUS_CODES } from 'node:http';
import { catchError, from, mergeMap, throwError, type Observable } from 'rxjs';
import { LockAcquireTimeoutError } from '../errors/redis-lock.errors.js';
import type {
  LockTimeoutResponse,
  WithLockOptions,
} from '../interfaces/with-lock-options.interface.js';
import { LockService } from '../lock.service.js';
import { WITH_LOCK_METADATA } from '../redis-lock.constants.js';

/**
 * Applied by `@WithLock` to the handlers it decorates. It takes no lock itself (the decorated
 * method does, exactly once per call); it turns a `LockAcquireTimeoutError` coming out of the
 * handler into the transport's answer: HTTP `timeoutStatus` (409) with `Retry-After`, an
 * `RpcException`, or a `WsException`. Every other error passes through untouched. To answer
 * differently, set `timeoutStatus` or `timeoutException` on the module or the decorator.
 */
@Injectable()
export class WithLockInterceptor implements NestInterceptor {
  constructor(
    protected readonly locks: LockService,
    @Optional() protected readonly adapterHost?: HttpAdapterHost,
  ) {}

  intercept(context: ExecutionContext, next: CallHandler): Observable<unknown> {
    return next
      .handle()
      .pipe(
        catchError((error: unknown) =>
          error instanceof LockAcquireTimeoutError
            ? from(this.translate(error, context)).pipe(
                mergeMap((answer) => throwError(() => answer)),
              )
            : throwError(() => error),
        ),
      );
  }

  /** The error that answers a lock timeout on this handler. */
  protected async translate(
    error: LockAcquireTimeoutError,
    context: ExecutionContext,
  ): Promise<unknown> {
    const response = this.timeoutResponse(context);
    if (response.timeoutException) return response.timeoutException(error, context);
    switch (context.getType<string>()) {
      case 'http':
        this.setRetryAfter(context, this.retryAfterSeconds(error));
        return this.createHttpException(error, response.timeoutStatus ?? 409);
      case 'rpc':
        return this.createRpcException(error);
      case 'ws':
        return this.createWsException(error);
      default:
        return error;
    }
  }

  /** The decorator's `timeoutStatus` / `timeoutException` if it has one, else the module's. */
  protected timeoutResponse(context: ExecutionContext): LockTimeoutResponse {
    const own = Reflect.getMetadata(WITH_LOCK_METADATA, context.getHandler()) as
      WithLockOptions | undefined;
    if (own?.timeoutStatus !== undefined || own?.timeoutException !== undefined) return own;
    return this.locks.timeoutResponse;
  }

  /** Seconds a client should wait before retrying: the holder's remaining TTL, at least 1. */
  protected retryAfterSeconds(error: LockAcquireTimeoutError): number {
    return Math.max(1, Math.ceil((error.retryAfterMs ?? error.acquireTimeout) / 1_000));
  }

  protected setRetryAfter(context: ExecutionContext, seconds: number): void {
    const adapter = this.adapterHost?.httpAdapter;
    adapter?.setHeader(context.switchToHttp().getResponse(), 'Retry-After', String(seconds));
  }

  protected createHttpException(error: LockAcquireTimeoutError, status: number): HttpException {
    return new HttpException(
      {
        statusCode: status,
        error: STATUS_CODES[status] ?? 'Error',
        message: `The resource is busy: another request holds its lock. Retry after ${this.retryAfterSeconds(error)} s.`,
      },
      status,
      { cause: error },
    );
  }

  protected async createRpcException(error: LockAcquireTimeoutError): Promise<unknown> {
    // Loaded on demand: only apps with microservice handlers have @nestjs/microservices.
    const { RpcException } = await import('@nestjs/microservices');
    return new RpcException({
      status: 'error',
      code: 'LOCK_TIMEOUT',
      message: error.message,
      retryAfterMs: error.retryAfterMs,
    });
  }

  protected async createWsException(error: LockAcquireTimeoutError): Promise<unknown> {
    const { WsException } = await import('@nestjs/websockets');
    return new WsException({ status: 'error', code: 'LOCK_TIMEOUT', message: error.message });
  }
}
