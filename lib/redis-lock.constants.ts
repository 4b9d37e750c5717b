/** Metadata key under which `@WithLock` stores its options on the decorated method. */
export const WITH_LOCK_METADATA = 'nestjs-redis-lock:with-lock';
