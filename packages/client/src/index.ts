export { createClient } from "./client.js";
export { nowIso, publishEvent } from "./events.js";
export { silentLogger } from "./logger.js";
export { readStream } from "./stream-reader.js";
export { isNotFound, openTopology, resolveTopologyOptions } from "./topology.js";

export type { BoxcarClient, ClientOptions, FollowOptions, LogChunk } from "./client.js";
export type { Logger } from "./logger.js";
export type { ReadStreamOptions } from "./stream-reader.js";
export type { ResolvedTopologyOptions, Topology, TopologyOptions } from "./topology.js";
export { findNatsServer, freePort, startNatsServer } from "./nats-server.js";
export type { NatsServer, NatsServerOptions } from "./nats-server.js";
