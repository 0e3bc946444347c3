export { startDispatcher } from "./dispatcher.js";
export { newJobId } from "./job-id.js";

export type { Dispatcher, DispatcherOptions } from "./dispatcher.js";
