// What the SDK's own interface takes and gives (a logger, the trace context), from the kernel it shares with the roles.
export { jsonOf, type Logger, newInbox, silentLogger, TRACEPARENT, TunnelError, TunnelErrorCode, traceparentOf } from "@boxcar/common";
export type { BoxcarClient, ClientOptions, JobEventsOptions, LocalInputFile, LogChunk, SubmitOptions } from "./boxcar-client.js";
export type { ClientLink } from "./chain-events.js";
export { createClient } from "./client.js";
export type { ResolveConnectionOptions, ResolvedConnection } from "./connection.js";
export { connectNats, DEFAULT_NATS_URL, identityOf, readNatsContext, resolveConnection } from "./connection.js";
export type { FollowOptions } from "./follow.js";
export type { PortForward, PortForwardOptions } from "./session-ports.js";
export type { SessionShell, ShellExit, ShellOptions } from "./session-shell.js";
export type { CopiedFile, CopyOptions } from "./session-transfers.js";
