/**
 * What a new session's workspace starts with, put there before anything runs in it: a
 * snapshot's files or a job's artifacts from the system's stores (each checked against its
 * digest), or a clone of a git repository made on the worker (git-seed.ts); and within what
 * bounds (`SEED_LIMITS`). The session host opens sessions with it.
 */

import { Readable } from "node:stream";
import type { Topology } from "@boxcar/fabric";
import {
  type AgentDefinition,
  type Artifact,
  BoxcarError,
  ErrorCode,
  type GitSeed,
  type SessionRecord,
  type WorkerOpenSession,
} from "@boxcar/protocol";
import type { z } from "zod";
import type { ResolvedWorkerOptions } from "../worker-options.js";
import type { LocalWorkspace } from "../workspace/local-workspace.js";
import { unpackInto } from "../workspace/workspace-archive.js";
import { cloneInto } from "./git-seed.js";

/** The most a snapshot or a clone may put in a new session's workspace (a Docker session's quota then holds it to the worker's own). */
const SEED_LIMITS = { maxBytes: 1024 ** 3, maxEntries: 100_000 };

/**
 * What fills a new session's workspace before anything runs in it: a snapshot's files, a clone
 * made here (outside the sandbox), or a job's artifacts; none for an empty one. Once it has
 * run, `seeded.source` says what the workspace started from, for the record.
 */
export function seedOf(
  ctx: { topology: Topology; options: Pick<ResolvedWorkerOptions, "secretsEnv"> },
  { from, git, artifacts }: Pick<z.infer<typeof WorkerOpenSession>, "from" | "artifacts"> & { git?: GitSeed | undefined },
  agent: AgentDefinition,
  seeded: { source?: SessionRecord["source"] },
): ((workspace: LocalWorkspace) => Promise<void>) | undefined {
  if (from !== undefined) {
    return async (workspace) => {
      await restore(ctx, from, workspace);
      seeded.source = { snapshot: from };
    };
  }
  if (git !== undefined) {
    return async (workspace) => {
      const { commit } = await cloneInto(git, workspace.dir, agent, ctx.options.secretsEnv, SEED_LIMITS);
      seeded.source = { git: { url: git.url, ...(git.ref !== undefined ? { ref: git.ref } : {}), commit } };
    };
  }
  if (artifacts !== undefined) {
    return async (workspace) => {
      await copyArtifacts(ctx, artifacts.files, workspace);
      seeded.source = { artifactsOf: artifacts.job };
    };
  }
  return undefined;
}

/** Fills a new session's workspace with a snapshot's files, checked against the store's digest. */
async function restore(ctx: { topology: Topology }, snapshotId: string, workspace: LocalWorkspace): Promise<void> {
  const found = await (await ctx.topology.snapshots()).get(snapshotId);
  if (!found) throw new BoxcarError(ErrorCode.notFound, `no snapshot ${snapshotId}`);
  await unpackInto(Readable.fromWeb(found.data as never), workspace, SEED_LIMITS);
  const corrupt = await found.error;
  if (corrupt) throw new BoxcarError(ErrorCode.sandboxFailed, `snapshot ${snapshotId} does not match its digest: ${corrupt.message}`);
}

/** Copies a job's stored artifacts into a new session's workspace, at their paths, each checked against the store's digest. */
async function copyArtifacts(ctx: { topology: Topology }, files: readonly Artifact[], workspace: LocalWorkspace): Promise<void> {
  const total = files.reduce((sum, f) => sum + f.size, 0);
  if (total > SEED_LIMITS.maxBytes || files.length > SEED_LIMITS.maxEntries) {
    throw new BoxcarError(
      ErrorCode.tooLarge,
      `the job's artifacts hold ${total} bytes in ${files.length} files: more than a workspace may start with`,
    );
  }
  for (const file of files) {
    const found = await ctx.topology.artifacts.get(file.object);
    if (!found) throw new BoxcarError(ErrorCode.notFound, `artifact ${file.path} is no longer stored (its job's retention is over)`);
    await workspace.writeFile(file.path, found.data);
    const corrupt = await found.error;
    if (corrupt) throw new BoxcarError(ErrorCode.sandboxFailed, `artifact ${file.path} does not match its digest: ${corrupt.message}`);
  }
}
