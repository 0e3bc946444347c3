/**
 * How an agent in a sandbox with no network reaches the gateway: the gateway listens on a Unix
 * socket in the agent's bind-mounted workspace, and a forwarder started beside the agent, in the
 * sandbox, listens on the sandbox's own 127.0.0.1 and passes each connection to that socket. The
 * agent's SDKs then use a plain `http://127.0.0.1:PORT` base URL, unchanged. The forwarder is a
 * few lines of Node.js (the agent image has it); without Node.js the agent is told why it has
 * no gateway.
 */

import { shellQuote } from "../sandbox/shell-word.js";

/** Where the forwarder listens inside the sandbox. */
export const FORWARD_PORT = 4317;

/** The socket and the forwarder, under the workspace's `.boxcar` folder. */
export const GATEWAY_SOCKET = ".boxcar/gateway.sock";
export const FORWARDER_SCRIPT = ".boxcar/gateway-forward.cjs";

/** The forwarder: port, socket and a file it writes once listening, as arguments. */
export const FORWARDER_SOURCE = `"use strict";
const net = require("node:net");
const fs = require("node:fs");
const [port, socket, ready] = process.argv.slice(2);
const server = net.createServer((client) => {
  const gateway = net.connect(socket);
  client.pipe(gateway);
  gateway.pipe(client);
  client.on("error", () => gateway.destroy());
  gateway.on("error", () => client.destroy());
});
server.listen(Number(port), "127.0.0.1", () => fs.writeFileSync(ready, ""));
`;

/**
 * The agent's command, run with the forwarder beside it: the forwarder starts first (the agent
 * waits up to 2 s for it to listen), the agent runs, and the forwarder is stopped when it ends;
 * the agent's exit status is the command's.
 */
export function withForwarder(argv: readonly string[], workspace: string): string[] {
  const script = `${workspace}/${FORWARDER_SCRIPT}`;
  const socket = `${workspace}/${GATEWAY_SOCKET}`;
  const ready = `${workspace}/.boxcar/gateway-forward.ready`;
  const wrapper = [
    'if ! command -v node >/dev/null 2>&1; then echo "boxcar: the model gateway is reached through a forwarder that needs node in the image; this image has none" >&2; fi',
    `if [ ! -S ${shellQuote(socket)} ]; then echo "boxcar: the model gateway's socket is not in this sandbox (its workspace is a copy, not the worker's folder)" >&2; fi`,
    `node ${shellQuote(script)} ${FORWARD_PORT} ${shellQuote(socket)} ${shellQuote(ready)} & forwarder=$!`,
    `i=0; while [ ! -e ${shellQuote(ready)} ] && [ $i -lt 100 ]; do sleep 0.02; i=$((i + 1)); done`,
    '"$@"; status=$?',
    'kill "$forwarder" 2>/dev/null',
    'exit "$status"',
  ].join("\n");
  return ["sh", "-c", wrapper, "sh", ...argv];
}
