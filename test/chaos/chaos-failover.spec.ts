/**
 * Chaos, short profile, on a Cluster (3 masters with a replica each) and through Sentinel (a
 * master, a replica, 3 Sentinels): network faults hit a worker's links to every data node, Redis
 * faults hit a master — a pause stays short of a failover, a crash becomes one.
 */
import { chaosSuite } from './chaos-suite.js';

chaosSuite('cluster');
chaosSuite('sentinel');
