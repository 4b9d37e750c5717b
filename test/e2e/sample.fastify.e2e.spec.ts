/** The sample app end to end on Fastify (see sample-e2e.suite.ts). */
import { sampleAppSuite } from './sample-e2e.suite.js';

sampleAppSuite('Fastify');
