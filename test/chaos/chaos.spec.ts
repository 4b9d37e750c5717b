/**
 * Chaos, short profile, on one Redis and in Redlock mode on three nodes (where Redis faults hit
 * one node). The full profile (`npm run chaos`) writes the committed report.
 */
import { chaosSuite } from './chaos-suite.js';

chaosSuite('standalone');
chaosSuite('redlock');
