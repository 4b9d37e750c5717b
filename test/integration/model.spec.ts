import { modelSuite } from '../model/model-suite.js';
import { standalone } from '../model/model-deployment.js';

/**
 * The model-based suite (see `test/model/`) against one Redis: one app reaches it through a link
 * the steps slow and cut, the other directly. `commandTimeout` is short (500 ms) so that a step
 * can hold a link cut for longer than a shutdown's deadline.
 */
modelSuite('one Redis', () => standalone(500));
