export type { Dispatcher, DispatcherOptions } from "./dispatcher.js";
export { startDispatcher } from "./dispatcher.js";
export { newJobId } from "./job-id.js";
