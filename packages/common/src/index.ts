export { type Deferred, deferred } from "./deferred.js";
export { newInbox } from "./inbox.js";
export { jsonOf } from "./json.js";
export type { Logger } from "./logger.js";
export { silentLogger } from "./logger.js";
export { failSpan, NOT_TRACED, type Span, SpanKind, startSpan, TRACEPARENT, traceparentOf } from "./trace.js";
export { TunnelError, TunnelErrorCode, TunnelHeader, TunnelStream, type TunnelStreamOptions } from "./tunnel-stream.js";
