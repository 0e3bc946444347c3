export type { Dispatcher } from "./dispatcher.js";
export { startDispatcher } from "./dispatcher.js";
export { DispatcherMetrics } from "./dispatcher-metrics.js";
export type { DispatcherOptions } from "./dispatcher-options.js";
export { MAX_OPEN_UPLOADS } from "./jobs/files.js";
export { newJobId } from "./jobs/job-id.js";
