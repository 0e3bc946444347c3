import Docker from "dockerode";

export const AGENT_IMAGE = process.env.BOXCAR_AGENT_IMAGE ?? "boxcar-agent:latest";

/**
 * Whether the Docker tests can run: an engine answers and the agent image is built. CI
 * (`BOXCAR_REQUIRE_DOCKER=1`, set by scripts/test.sh) fails instead of skipping.
 */
export async function dockerReady(image = AGENT_IMAGE): Promise<boolean> {
  const docker = new Docker();
  let reason: string | undefined;
  try {
    await docker.ping();
    await docker.getImage(image).inspect();
  } catch (err) {
    reason = (err as { statusCode?: number }).statusCode === 404 ? `the image ${image} is not built` : "no Docker engine answers";
  }
  if (reason === undefined) return true;
  const message = `Docker tests cannot run: ${reason}. Run scripts/start-docker.sh and scripts/build-images.sh.`;
  if (process.env.BOXCAR_REQUIRE_DOCKER === "1") throw new Error(message);
  process.stderr.write(`\n!!!!!!!!!!\n!!! SKIPPING DOCKER TESTS: ${message}\n!!!!!!!!!!\n\n`);
  return false;
}

/**
 * Containers of one Boxcar system (by prefix label), optionally of one job: a cold container
 * says its job in a label, a warm one in the name it was given when the job took it.
 */
export async function boxcarContainers(prefix: string, jobId?: string): Promise<Docker.ContainerInfo[]> {
  const all = await new Docker().listContainers({ all: true, filters: { label: [`boxcar.prefix=${prefix}`] } });
  if (jobId === undefined) return all;
  return all.filter((c) => c.Labels["boxcar.job"] === jobId || c.Names.some((n) => n.startsWith(`/boxcar-${jobId}.`)));
}

/** The attempt a container ran: its label, or for a warm container the name its job gave it. */
export function attemptOf(container: Docker.ContainerInfo): string | undefined {
  const warm = container.Names.map((n) => /^\/boxcar-[0-9a-z]+\.(\d+)\./.exec(n)?.[1]).find((a) => a);
  return container.Labels["boxcar.attempt"] ?? warm;
}
