import { ignoreDeadline, within } from './within.js';

/**
 * Writes sent to Redis that nobody else waits for (an undo, an orphaned grant's release, a
 * release still in flight when shutdown begins), which closing the connection must not cut off:
 * a command queued behind its QUIT never runs, and its lock stays for its TTL.
 */
export class InFlight<Tag = undefined> {
  private readonly pending = new Map<Promise<void>, Tag>();

  /** Follows `write` until it settles (either way); returns it as it is. */
  track<T>(write: Promise<T>, tag?: Tag): Promise<T> {
    const forget = (): void => void this.pending.delete(settled);
    const settled: Promise<void> = write.then(forget, forget);
    this.pending.set(settled, tag as Tag);
    return write;
  }

  /** Settles when every write tagged `tag` has, or `undefined` if none is in flight. */
  of(tag: Tag): Promise<unknown> | undefined {
    const tagged: Promise<void>[] = [];
    for (const [settled, each] of this.pending) if (each === tag) tagged.push(settled);
    return tagged.length > 0 ? Promise.all(tagged) : undefined;
  }

  /**
   * Settles once nothing is in flight, writes that start meanwhile included, or at `deadline`
   * (`performance.now()`), whichever comes first: with the tags of the writes still in flight.
   */
  async drain(deadline: number): Promise<Tag[]> {
    while (this.pending.size > 0) {
      const left = deadline - performance.now();
      if (left <= 0) break;
      await within(Promise.all(this.pending.keys()), left, []).catch(ignoreDeadline);
    }
    return [...this.pending.values()];
  }
}
