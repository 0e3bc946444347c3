import type { Topology } from "@boxcar/fabric";
import { harnessObjects } from "@boxcar/protocol";
import type { ModelMessage } from "ai";
import tar from "tar-stream";
import type { Sandbox } from "../sandbox/sandbox.js";
import { AgentPaths } from "../workspace/agent-contract.js";

/**
 * A prompt agent's loop, checkpointed (docs/harness.md#durable-steps): after the model's answer
 * and after each tool call's result, its conversation and counts are written to the Object Store
 * (`harness/<job>/state`), and after each tool call that can change files, its workspace
 * (`harness/<job>/workspace.tar`), before the loop goes on. A later attempt of the job starts
 * from there: no completed model call is made again, and only a tool call that was under way
 * when the attempt ended runs again.
 */

export interface LoopState {
  v: 1;
  /** The attempt that wrote it. */
  attempt: number;
  /** Model calls made so far. */
  steps: number;
  /** The conversation after the rendered prompt: the model's answers and the tools' results. */
  messages: ModelMessage[];
  tokens: { in: number; out: number };
  /** The prompt's tokens of the last model call: past the agent's `compactAt`, the conversation is compacted. */
  lastPromptTokens?: number;
  /** People's decisions on calls of tools that wait for approval, by call id. */
  approvals?: Record<string, { approved: boolean; reason?: string }>;
  /** How many steps in a row had only tool calls that failed (no progress). */
  failingSteps?: number;
  /** The last tool call (its name and arguments) and how many times in a row it was asked for. */
  repeated: { key: string; count: number };
}

/** The largest workspace kept with a checkpoint: past it, the loop says so and keeps no workspace. */
export const MAX_WORKSPACE_SNAPSHOT = 64 * 1024 * 1024;

export class Checkpoints {
  private readonly names: { state: string; workspace: string };

  constructor(
    private readonly topology: Pick<Topology, "artifacts">,
    jobId: string,
  ) {
    this.names = harnessObjects(jobId);
  }

  async load(): Promise<{ state: LoopState; workspace: Uint8Array | null } | undefined> {
    const state = await this.topology.artifacts.getBlob(this.names.state);
    if (!state) return undefined;
    const parsed = JSON.parse(new TextDecoder().decode(state)) as LoopState;
    if (parsed.v !== 1) return undefined;
    return { state: parsed, workspace: await this.topology.artifacts.getBlob(this.names.workspace) };
  }

  async save(state: LoopState): Promise<void> {
    await this.topology.artifacts.putBlob({ name: this.names.state }, new TextEncoder().encode(JSON.stringify(state)));
  }

  /** Keeps the workspace (its files but `.boxcar/`); false when it is too large to keep. */
  async saveWorkspace(sandbox: Pick<Sandbox, "listFiles" | "readFile">): Promise<boolean> {
    const archive = await packWorkspace(sandbox);
    if (!archive) return false;
    await this.topology.artifacts.putBlob({ name: this.names.workspace }, archive);
    return true;
  }
}

async function packWorkspace(sandbox: Pick<Sandbox, "listFiles" | "readFile">): Promise<Uint8Array | undefined> {
  const files = (await sandbox.listFiles()).filter((f) => !f.path.startsWith(`${AgentPaths.reserved}/`));
  if (files.reduce((sum, f) => sum + f.size, 0) > MAX_WORKSPACE_SNAPSHOT) return undefined;
  const pack = tar.pack();
  const chunks: Buffer[] = [];
  pack.on("data", (chunk: Buffer) => chunks.push(chunk));
  const ended = new Promise<void>((done, fail) => {
    pack.on("end", done);
    pack.on("error", fail);
  });
  for (const file of files) {
    const body = await sandbox.readFile(file.path);
    if (!body) continue; // gone since it was listed
    const parts: Uint8Array[] = [];
    for await (const part of body) parts.push(part);
    const data = Buffer.concat(parts);
    await new Promise<void>((done, fail) => pack.entry({ name: file.path, size: data.length }, data, (err) => (err ? fail(err) : done())));
  }
  pack.finalize();
  await ended;
  return Buffer.concat(chunks);
}

/** Writes a kept workspace's files into a new sandbox's workspace. */
export async function restoreWorkspace(sandbox: Pick<Sandbox, "writeFile">, archive: Uint8Array): Promise<number> {
  const extract = tar.extract();
  let restored = 0;
  const done = new Promise<void>((resolve, reject) => {
    extract.on("entry", (header, stream, next) => {
      const parts: Buffer[] = [];
      stream.on("data", (part: Buffer) => parts.push(part));
      stream.on("end", () => {
        if (header.type !== "file") return next();
        sandbox.writeFile(header.name, Buffer.concat(parts)).then(() => {
          restored++;
          next();
        }, reject);
      });
      stream.on("error", reject);
    });
    extract.on("finish", resolve);
    extract.on("error", reject);
  });
  extract.end(Buffer.from(archive));
  await done;
  return restored;
}
