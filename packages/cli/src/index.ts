export { ExitCode } from "./exit-codes.js";
export { main } from "./main.js";

export type { Io } from "./context.js";
