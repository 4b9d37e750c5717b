import { modelSuite } from '../model/model-suite.js';
import { redlock } from '../model/model-deployment.js';

/**
 * The model-based suite (see `test/model/`) in Redlock mode, on three nodes: one app reaches the
 * first through a link the steps slow and cut; nodes pause, one may restart empty, and all forget
 * their scripts. No semaphores or read locks here (Redlock mode has none).
 */
modelSuite('Redlock, 3 nodes', () => redlock(500), 6);
