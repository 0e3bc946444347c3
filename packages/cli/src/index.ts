export type { Io } from "./context.js";
export { ExitCode } from "./exit-codes.js";
export { main } from "./main.js";
export { MetricsEndpoint } from "./metrics.js";
