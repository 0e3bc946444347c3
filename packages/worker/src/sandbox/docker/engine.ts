/**
 * What the worker asks the Docker engine, and how it reads the answers: whether an image is
 * there (pulled if not, with the PATH it sets), which network an agent may join, the worker's
 * own container and its networks, and the engine's errors (a missing image, a bind source it
 * cannot see, what is already gone).
 */

import { hostname } from "node:os";
import { BoxcarError, ErrorCode } from "@boxcar/protocol";
import type Docker from "dockerode";

/**
 * The network mode for an agent's wish: `none` (default), `bridge`, or an existing network, but
 * never the worker's own (`host`, another container's, or a network the worker's container is
 * on: the one NATS and the roles use).
 */
export async function checkNetwork(docker: Docker, wish: string, own: ReadonlySet<string>): Promise<string> {
  if (wish === "none" || wish === "bridge") return wish;
  if (wish === "host" || wish.startsWith("container:")) {
    throw new BoxcarError(ErrorCode.invalid, `runtime.network ${wish} is not allowed: it would share the worker's network`);
  }
  let found: { Id: string; Name: string };
  try {
    found = await docker.getNetwork(wish).inspect();
  } catch (err) {
    if (statusOf(err) === 404) throw new BoxcarError(ErrorCode.invalid, `runtime.network: there is no Docker network named ${wish}`);
    throw err;
  }
  if (own.has(found.Id) || own.has(found.Name)) {
    throw new BoxcarError(
      ErrorCode.invalid,
      `runtime.network ${wish} is not allowed: the worker itself is on it (agents never join the system's networks)`,
    );
  }
  return wish;
}

/** The worker's own container on this engine; undefined when it is not in one. */
export async function selfContainer(docker: Docker): Promise<Docker.ContainerInspectInfo | undefined> {
  try {
    return await docker.getContainer(hostname()).inspect();
  } catch {
    return undefined;
  }
}

/** The ids and names of the networks a container is on. */
export function networksOf(container: Docker.ContainerInspectInfo | undefined): Set<string> {
  const networks = container?.NetworkSettings?.Networks ?? {};
  return new Set(Object.entries(networks).flatMap(([name, n]) => [name, n.NetworkID]));
}

/** The engine's answer to a container of an image it does not have. */
export function isMissingImage(err: unknown): boolean {
  return statusOf(err) === 404 && /no such image/i.test(firstLine(err));
}

/** The engine's answer to a bind mount of a folder it does not have. */
export function isMissingBindSource(err: unknown): boolean {
  return statusOf(err) === 400 && /bind source path does not exist/i.test(firstLine(err));
}

/**
 * Makes sure `image` is on the engine, pulling it (with `auth`, for this pull only) if not.
 * Returns the PATH the image sets for its processes.
 */
export async function ensureImage(
  docker: Docker,
  image: string,
  auth: Docker.AuthConfig | undefined,
  signal?: AbortSignal,
): Promise<string> {
  const pathOf = (info: Docker.ImageInspectInfo) =>
    info.Config.Env?.find((e) => e.startsWith("PATH="))?.slice(5) ?? "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
  try {
    return pathOf(await docker.getImage(image).inspect());
  } catch (err) {
    if (statusOf(err) !== 404) throw err;
  }
  try {
    const progress = await docker.pull(image, auth ? { authconfig: auth, abortSignal: signal } : { abortSignal: signal });
    await new Promise<void>((resolve, reject) => docker.modem.followProgress(progress, (err) => (err ? reject(err) : resolve())));
    return pathOf(await docker.getImage(image).inspect());
  } catch (cause) {
    throw new BoxcarError(
      ErrorCode.imageUnavailable,
      `image ${image} is not on this Docker engine and could not be pulled: ${firstLine(cause)}`,
      { cause },
    );
  }
}

export function statusOf(err: unknown): number | undefined {
  return (err as { statusCode?: number } | undefined)?.statusCode;
}

/** Removing or killing what is already gone is fine. */
export function ignoreGone(err: unknown): void {
  const status = statusOf(err);
  if (status !== 404 && status !== 409) throw err;
}

export function firstLine(err: unknown): string {
  const message = (err as { json?: { message?: string } }).json?.message ?? (err as Error).message ?? String(err);
  return message.split("\n")[0] ?? message;
}
