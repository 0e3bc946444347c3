export type { Dispatcher, DispatcherOptions } from "./dispatcher.js";
export { startDispatcher } from "./dispatcher.js";
export { DispatcherMetrics } from "./dispatcher-metrics.js";
export { MAX_OPEN_UPLOADS } from "./files.js";
export { newJobId } from "./job-id.js";
