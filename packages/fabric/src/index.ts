/**
 * Fabric's public entry (`@boxcar/fabric`): what a program that runs or operates a Boxcar system
 * on NATS needs. Opening the topology (its streams and buckets, and their sizes), signing and
 * checking work items, a nats-server for development and tests, backup and restore. What the
 * roles share beneath it (the job store, event publishing, KV and stream reading, erasure, NATS's
 * errors told apart) is the internal entry, `@boxcar/fabric/internal` (internal.ts).
 */
export { BackupFileError } from "./backup/format.js";
export { readBackupPlan } from "./backup/plan.js";
export { type RestoredStream, RestoreError, type RestoreSummary, restoreSystem } from "./backup/restore.js";
export { type StreamSummary, systemStreams } from "./backup/streams.js";
export { type BackupSummary, backupSystem } from "./backup/write.js";
export { patiently } from "./nats-errors.js";
export type { NatsClusterOptions, NatsServer, NatsServerOptions, NatsWebsocketOptions } from "./nats-server.js";
export { findNatsServer, freePort, startNatsServer } from "./nats-server.js";
export type { Topology } from "./topology.js";
export { openTopology } from "./topology.js";
export type { ResolvedTopologyOptions, StreamLimits, TopologyOptions } from "./topology-options.js";
export { DEFAULT_STREAM_LIMITS, resolveTopologyOptions } from "./topology-options.js";
export { WorkSigner, WorkVerifier } from "./work-signature.js";
