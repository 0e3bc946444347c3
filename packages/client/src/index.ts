export type { ClientLink } from "./chain-events.js";
export type { BoxcarClient, ClientOptions, FollowOptions, JobEventsOptions, LocalInputFile, LogChunk, SubmitOptions } from "./client.js";
export { createClient } from "./client.js";
export type { ResolveConnectionOptions, ResolvedConnection } from "./connection.js";
export { connectNats, DEFAULT_NATS_URL, identityOf, newInbox, readNatsContext, resolveConnection } from "./connection.js";
export { jsonOf } from "./json.js";
export type { Logger } from "./logger.js";
export { silentLogger } from "./logger.js";
export { failSpan, type Span, SpanKind, startSpan, TRACEPARENT, traceparentOf } from "./trace.js";
