/**
 * How a job's workspace reaches its container (docs/docker.md): bind-mounted from this machine
 * when the engine can see its folders (`bindable`, and for a worker in a container,
 * `sharesFolder`), else copied in and out; and a bind-mounted workspace given to the agent's
 * user (`giveTo`).
 */

import { lchown, readdir } from "node:fs/promises";
import { join } from "node:path";
import type Docker from "dockerode";

/** How a job's workspace reaches its container (docs/docker.md). */
export type WorkspaceMounting = "bind" | "copy";

/**
 * Whether a folder of this machine can be bind-mounted as an agent's workspace: the engine is
 * reached through a local socket, maps no users (rootless or `userns-remap` would give the
 * folder to another uid), and this worker can give the folder to the agent's user (it is root,
 * or that user). The worker must also not be in a container of this engine (checked apart):
 * its folders are not the engine's.
 */
export async function bindable(docker: Docker, owner: { uid: number }): Promise<boolean> {
  if (!(docker.modem as { socketPath?: unknown }).socketPath) return false;
  const uid = process.getuid?.();
  if (uid !== 0 && uid !== owner.uid) return false;
  const info = (await docker.info()) as { SecurityOptions?: string[] };
  return !(info.SecurityOptions ?? []).some((o) => o.includes("name=rootless") || o.includes("name=userns"));
}

/**
 * Whether a worker in container `self` has `folder` at the same path as the engine's machine: it
 * lies in a bind mount whose source and target are the same path (`-v /srv/boxcar:/srv/boxcar`),
 * so a workspace made there can be bind-mounted into a job container by that path.
 */
export function sharesFolder(self: Pick<Docker.ContainerInspectInfo, "Mounts">, folder: string): boolean {
  const trimmed = (path: string) => (path.length > 1 ? path.replace(/\/+$/, "") : path);
  const inside = (m: { Destination: string }) => {
    const target = trimmed(m.Destination);
    return folder === target || folder.startsWith(target === "/" ? "/" : `${target}/`);
  };
  // The innermost mount holding the folder is the one its files are on.
  const holding = (self.Mounts ?? []).filter(inside).sort((a, b) => trimmed(b.Destination).length - trimmed(a.Destination).length)[0];
  return holding?.Type === "bind" && trimmed(holding.Source) === trimmed(holding.Destination);
}

/** Gives a staged workspace, every folder and file in it, to the agent's user (symlinks themselves, not their targets). */
export async function giveTo(dir: string, owner: { uid: number; gid: number }): Promise<void> {
  await lchown(dir, owner.uid, owner.gid);
  for (const entry of await readdir(dir, { withFileTypes: true })) {
    const path = join(dir, entry.name);
    if (entry.isDirectory()) await giveTo(path, owner);
    else await lchown(path, owner.uid, owner.gid);
  }
}
