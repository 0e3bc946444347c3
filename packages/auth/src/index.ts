export type { AuthUser, InitAuthOptions } from "./auth-dir.js";
export { AuthDir } from "./auth-dir.js";
export { pushAccount } from "./push.js";
export { checkHost, DEFAULT_SERVER_HOSTS } from "./tls.js";
