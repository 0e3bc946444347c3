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

/** Containers of one Boxcar system (by prefix label), optionally of one job. */
export async function boxcarContainers(prefix: string, jobId?: string): Promise<Docker.ContainerInfo[]> {
  const labels = [`boxcar.prefix=${prefix}`, ...(jobId ? [`boxcar.job=${jobId}`] : [])];
  return new Docker().listContainers({ all: true, filters: { label: labels } });
}
