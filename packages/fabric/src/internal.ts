/**
 * Fabric's internal entry (`@boxcar/fabric/internal`): everything of the public entry, and what
 * the roles (the dispatcher and the worker) share beneath it: the job store and its seam with
 * the events, event publishing, KV and stream reading, erasure, and NATS's errors told apart.
 */

export { type ErasableBucket, type Erasure, eraseEntry, markErased, removeRevision } from "./erase.js";
export { type EventStream, nowIso, publishEvent } from "./events.js";
export * from "./index.js";
export { type Announce, EventNotStored, type JobChange, type JobHandle, type JobKeys, JobStore } from "./job-store.js";
export { followKv, getJson, keysOf, listJson, type Revisioned } from "./kv-json.js";
export { isNoResponders, isNotFound, isRevisionConflict, isStorageFull, isTransientJetStreamError } from "./nats-errors.js";
export { removeObject } from "./objects.js";
export { type ReadStreamOptions, readStream, storedMessages } from "./stream-reader.js";
export { DUPLICATE_WINDOW_MS } from "./topology.js";
export { inputDigest, SIGNATURE_HEADER, SIGNER_HEADER } from "./work-signature.js";
