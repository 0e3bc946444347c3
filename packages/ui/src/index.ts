export { type Principal, startUiServer, type UiServer, type UiServerOptions } from "./server.js";
