import { modelSuite } from '../model/model-suite.js';
import { inMemory } from '../model/model-deployment.js';

/**
 * The model-based suite (see `test/model/`) against `RedisLockTestingModule`: its two apps share
 * one in-memory store, and every step but Redis's faults applies. The testing module is honest
 * only if the same sequences hold on it as on Redis.
 */
modelSuite('in memory (RedisLockTestingModule)', () => inMemory(500));
