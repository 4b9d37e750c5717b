import { modelSuite } from '../model/model-suite.js';
import { cluster } from '../model/model-deployment.js';

/**
 * The model-based suite (see `test/model/`) on a Cluster of three masters: one app reaches every
 * node through links the steps slow and cut (ioredis `natMap`); masters pause and forget their
 * scripts; every other sequence, the clients prefix keys with a hash tag of their own.
 */
modelSuite('Cluster, 3 masters', () => cluster(500), 6);
