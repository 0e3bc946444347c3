import { chmod, rm } from "node:fs/promises";
import { createServer, type Server, type Socket } from "node:net";
import { join } from "node:path";
import type { Logger } from "@boxcar/common";
import { BoxcarError, ErrorCode, type PromptAgent } from "@boxcar/protocol";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { ReadBuffer, serializeMessage } from "@modelcontextprotocol/sdk/shared/stdio.js";
import type { Transport } from "@modelcontextprotocol/sdk/shared/transport.js";
import type { JSONRPCMessage } from "@modelcontextprotocol/sdk/types.js";
import { jsonSchema, type ToolSet, tool } from "ai";
import type { AttemptLease } from "../sandbox/lifeline.js";
import type { Sandbox } from "../sandbox/sandbox.js";
import { bound, type ToolAnswer } from "./tools.js";

/**
 * A prompt agent's MCP servers (docs/harness.md#mcp-servers), each started **inside** the job's
 * sandbox and spoken to over its stdin and stdout. A sandbox's workspace is this worker's folder
 * (host, or Docker's bind mount), so the worker listens on a Unix socket there and a bridge of a
 * few lines of Node.js, run in the sandbox beside the agent's tools, starts the server and joins
 * its stdio to that socket: the server runs with the sandbox's network (none), limits and user,
 * and needs none of its own. The worker is its MCP client (`@modelcontextprotocol/sdk`).
 */

type McpServer = PromptAgent["mcp"][number];

export interface McpServers {
  /** Their tools, each named `<server>__<tool>`, as the model is offered them. */
  readonly tools: ToolSet;
  /** Whether a tool name is one of theirs. */
  has(name: string): boolean;
  /** Calls one of their tools; a failure is a tool error the model reads. */
  call(name: string, input: unknown, signal: AbortSignal): Promise<ToolAnswer>;
  close(): Promise<void>;
}

export interface McpContext {
  sandbox: Sandbox;
  env: Record<string, string>;
  signal: AbortSignal;
  attemptLease?: AttemptLease | undefined;
  log: Logger;
}

/** How long a server has to start and list its tools, and a tool call to answer. */
const START_TIMEOUT_MS = 30_000;
const CALL_TIMEOUT_MS = 120_000;
const BRIDGE = ".boxcar/mcp-bridge.cjs";

/** Starts each server in the sandbox and lists its tools; a server that does not start fails the attempt, saying why. */
export async function startMcpServers(servers: readonly McpServer[], ctx: McpContext): Promise<McpServers> {
  const started: Started[] = [];
  try {
    if (servers.length > 0) await ctx.sandbox.writeFile(BRIDGE, new TextEncoder().encode(BRIDGE_SOURCE));
    for (const server of servers) started.push(await start(server, ctx));
  } catch (err) {
    await Promise.all(started.map((s) => s.close()));
    throw err;
  }
  const byTool = new Map<string, { server: Started; tool: string }>();
  const tools: ToolSet = {};
  for (const server of started) {
    for (const offered of server.tools) {
      const name = `${server.name}__${offered.name}`.replace(/[^A-Za-z0-9_-]/g, "_").slice(0, 64);
      byTool.set(name, { server, tool: offered.name });
      tools[name] = tool({
        description: `${offered.description ?? offered.name} (MCP server ${server.name}, in the sandbox)`,
        inputSchema: jsonSchema(offered.inputSchema as Parameters<typeof jsonSchema>[0]),
      });
    }
  }
  return {
    tools,
    has: (name) => byTool.has(name),
    async call(name, input, signal) {
      const found = byTool.get(name);
      if (!found) return { output: `there is no tool ${JSON.stringify(name)}`, error: true };
      try {
        const result = await found.server.client.callTool(
          { name: found.tool, arguments: (input ?? {}) as Record<string, unknown> },
          undefined,
          {
            signal,
            timeout: CALL_TIMEOUT_MS,
          },
        );
        const parts = (result.content ?? []) as { type: string; text?: string }[];
        const text = parts.map((p) => (p.type === "text" && typeof p.text === "string" ? p.text : JSON.stringify(p))).join("\n");
        return { output: bound(text), error: result.isError === true };
      } catch (err) {
        if (signal.aborted) throw err;
        return { output: `${name} failed: ${(err as Error).message}`, error: true };
      }
    },
    close: async () => {
      await Promise.all(started.map((s) => s.close()));
    },
  };
}

interface Started {
  name: string;
  client: Client;
  tools: { name: string; description?: string; inputSchema: unknown }[];
  close(): Promise<void>;
}

async function start(server: McpServer, ctx: McpContext): Promise<Started> {
  const folder = ctx.sandbox.localFolder;
  if (!folder) {
    throw new BoxcarError(
      ErrorCode.noSandbox,
      `MCP server ${server.name} needs a sandbox whose workspace is this worker's folder (host, or Docker with the workspace bind-mounted); this ${ctx.sandbox.kind} sandbox's is not`,
    );
  }
  const socketName = `.boxcar/mcp-${server.name}.sock`;
  const socketPath = join(folder, socketName);
  const listener: Server = createServer();
  await rm(socketPath, { force: true });
  await new Promise<void>((ready, fail) => {
    listener.once("error", fail);
    listener.listen(socketPath, () => ready());
  });
  await chmod(socketPath, 0o666); // the sandbox's user connects; only what runs in the sandbox can reach the file
  const stop = new AbortController();
  const onJobEnd = () => stop.abort();
  ctx.signal.addEventListener("abort", onJobEnd, { once: true });
  let stderr = "";
  const running = ctx.sandbox.exec(["node", BRIDGE, socketName, ...server.command], {
    env: { ...ctx.env, ...server.env },
    signal: stop.signal,
    ...(ctx.attemptLease ? { attemptLease: ctx.attemptLease } : {}),
    onOutput: (stream, chunk) => {
      if (stream === "stderr") stderr = (stderr + Buffer.from(chunk).toString("utf8")).slice(-2_000);
    },
  });
  let client: Client | undefined;
  const close = async () => {
    ctx.signal.removeEventListener("abort", onJobEnd);
    await client?.close().catch(() => undefined);
    stop.abort();
    await running.catch(() => undefined);
    listener.close();
    await rm(socketPath, { force: true });
  };
  try {
    const socket = await new Promise<Socket>((connected, fail) => {
      const timer = setTimeout(() => fail(new Error(`it did not start within ${START_TIMEOUT_MS / 1000} s`)), START_TIMEOUT_MS);
      listener.once("connection", (s: Socket) => {
        clearTimeout(timer);
        connected(s);
      });
      running.then(
        (exec) => {
          clearTimeout(timer);
          fail(new Error(`it ended before it connected (exit code ${exec.exitCode ?? exec.signal})`));
        },
        (err: unknown) => {
          clearTimeout(timer);
          fail(err);
        },
      );
    });
    client = new Client({ name: "boxcar", version: "1" });
    await client.connect(new SocketTransport(socket), { timeout: START_TIMEOUT_MS });
    const { tools } = await client.listTools(undefined, { timeout: START_TIMEOUT_MS });
    ctx.log.info({ server: server.name, tools: tools.map((t) => t.name) }, "MCP server started in the sandbox");
    return { name: server.name, client, tools, close };
  } catch (err) {
    await close();
    throw new BoxcarError(
      ErrorCode.agentFailed,
      `MCP server ${server.name} could not be started in the sandbox: ${(err as Error).message}${stderr ? `; its stderr: ${stderr.trim()}` : ""}`,
    );
  }
}

/** MCP's stdio framing (one JSON-RPC message a line) over the socket the bridge joined to the server's stdio. */
class SocketTransport implements Transport {
  onclose?: () => void;
  onerror?: (error: Error) => void;
  onmessage?: (message: JSONRPCMessage) => void;
  private readonly buffer = new ReadBuffer();

  constructor(private readonly socket: Socket) {}

  async start(): Promise<void> {
    this.socket.on("data", (chunk: Buffer) => {
      this.buffer.append(chunk);
      for (;;) {
        let message: JSONRPCMessage | null;
        try {
          message = this.buffer.readMessage();
        } catch (err) {
          this.onerror?.(err as Error);
          continue;
        }
        if (!message) break;
        this.onmessage?.(message);
      }
    });
    this.socket.on("error", (err) => this.onerror?.(err));
    this.socket.on("close", () => this.onclose?.());
  }

  send(message: JSONRPCMessage): Promise<void> {
    return new Promise((done, fail) => this.socket.write(serializeMessage(message), (err) => (err ? fail(err) : done())));
  }

  async close(): Promise<void> {
    this.socket.destroy();
  }
}

/** Runs in the sandbox: starts the server and joins its stdin and stdout to the worker's socket. */
const BRIDGE_SOURCE = `"use strict";
const net = require("node:net");
const { spawn } = require("node:child_process");
const [socket, command, ...args] = process.argv.slice(2);
const conn = net.connect(socket);
conn.on("error", (err) => { process.stderr.write("boxcar: cannot reach the worker's socket: " + err.message + "\\n"); process.exit(1); });
conn.on("connect", () => {
  const child = spawn(command, args, { stdio: ["pipe", "pipe", "inherit"] });
  child.on("error", (err) => { process.stderr.write("boxcar: cannot start the MCP server: " + err.message + "\\n"); conn.destroy(); process.exit(127); });
  conn.pipe(child.stdin);
  child.stdout.pipe(conn);
  child.stdin.on("error", () => {});
  conn.on("close", () => child.kill());
  child.on("exit", (code) => { conn.end(); process.exitCode = code === null ? 1 : code; });
});
`;
