export { WhileLeader } from './decorators/while-leader.decorator.js';
export { WithLock } from './decorators/with-lock.decorator.js';
export {
  LeaderElectionTimeoutError,
  LeadershipStoppedError,
  LockAcquireAbortedError,
  LockAcquireTimeoutError,
  LockArgumentError,
  LockBackendError,
  LockKeyResolutionError,
  LockLostError,
  LockQuorumError,
  LockReplicationError,
  RedisLockConfigurationError,
  RedisLockError,
  RedisLockShutdownError,
  type LockKeyProblem,
  type LogKeys,
  type LockLostReason,
  type LockOperation,
} from './errors/redis-lock.errors.js';
export type {
  AcquireOptions,
  ForcedRelease,
  Lock,
  LockInspection,
} from './interfaces/lock.interface.js';
export type { LockEvent } from './interfaces/lock-event.interface.js';
export type {
  LockDefaults,
  RedisLockModuleOptions,
  ReplicaAck,
} from './interfaces/redis-lock-options.interface.js';
export type {
  LockKeySource,
  LockTimeoutExceptionFactory,
  LockTimeoutResponse,
  WithLockOptions,
} from './interfaces/with-lock-options.interface.js';
export { getCurrentLock } from './engine/lock.context.js';
export type {
  ElectedOptions,
  LeaderInfo,
  LeaderTerm,
  Leadership,
  LeadOptions,
} from './lock.leadership.js';
export { LockService } from './lock.service.js';
export { RedisLockModule } from './redis-lock.module.js';
export { MODULE_OPTIONS_TOKEN as REDIS_LOCK_MODULE_OPTIONS } from './redis-lock.module-definition.js';
