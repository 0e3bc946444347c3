export {
  BackupFileError,
  type BackupSummary,
  backupSystem,
  type RestoredStream,
  RestoreError,
  type RestoreSummary,
  readBackupPlan,
  restoreSystem,
  type StreamSummary,
  systemStreams,
} from "./backup.js";
export { jobEvent, nowIso, publishEvent } from "./events.js";
export type { JobChange, JobHandle } from "./job-store.js";
export { JobStore } from "./job-store.js";
export type { Revisioned } from "./kv-json.js";
export { followKv, getJson, keysOf, listJson } from "./kv-json.js";
export { isNoResponders, isNotFound, isRevisionConflict, isStorageFull, isTransientJetStreamError, patiently } from "./nats-errors.js";
export type { NatsClusterOptions, NatsServer, NatsServerOptions, NatsWebsocketOptions } from "./nats-server.js";
export { findNatsServer, freePort, startNatsServer } from "./nats-server.js";
export { removeObject } from "./objects.js";
export type { ReadStreamOptions } from "./stream-reader.js";
export { readStream, storedMessages } from "./stream-reader.js";
export type { Topology } from "./topology.js";
export { DUPLICATE_WINDOW_MS, openTopology } from "./topology.js";
export type { ResolvedTopologyOptions, StreamLimits, TopologyOptions } from "./topology-options.js";
export { DEFAULT_STREAM_LIMITS, resolveTopologyOptions } from "./topology-options.js";
export { inputDigest, SIGNATURE_HEADER, SIGNER_HEADER, WorkSigner, WorkVerifier } from "./work-signature.js";
