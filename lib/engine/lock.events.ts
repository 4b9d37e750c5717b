import type { Logger } from '@nestjs/common';
import { Observable, Subject } from 'rxjs';
import type { LockEvent } from '../interfaces/lock-event.interface.js';

/**
 * The lock events of one `LockService`. Free while nobody listens: emitters check `observed`
 * before they build an event. Events are delivered synchronously, in order, to every subscriber;
 * what a subscriber does (or throws) never reaches the lock operation that emitted the event.
 */
export class LockEvents {
  private readonly subject = new Subject<LockEvent>();
  private subscribers = 0;
  readonly observable: Observable<LockEvent>;

  constructor(private readonly logger: Logger) {
    this.observable = new Observable<LockEvent>((subscriber) => {
      this.subscribers++;
      const subscription = this.subject.subscribe(subscriber);
      return () => {
        this.subscribers--;
        subscription.unsubscribe();
      };
    });
  }

  /** Whether anyone listens: build and emit events only then. */
  get observed(): boolean {
    return this.subscribers > 0;
  }

  emit(event: LockEvent): void {
    try {
      this.subject.next(event);
    } catch (error) {
      // rxjs reports a subscriber's own error asynchronously; this only guards against an
      // operator chain that throws synchronously.
      this.logger.warn(`A LockService.events subscriber threw: ${String(error)}`);
    }
  }

  /** Completes the stream (module shutdown). */
  complete(): void {
    this.subject.complete();
  }
}
