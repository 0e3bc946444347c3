import type Docker from "dockerode";

/**
 * Creates a container whose command reads its stdin (a warm container's script, a session's
 * helper) and attaches to its stdin, stdout and stderr before it starts, so nothing it writes is
 * missed. `stdinOnce`: the command's stdin ends when the attached stream's end is sent. Removes
 * the container if attaching fails.
 */
export async function createAttached(
  docker: Docker,
  options: Docker.ContainerCreateOptions,
  stdinOnce: boolean,
): Promise<{ container: Docker.Container; stream: NodeJS.ReadWriteStream }> {
  const container = await docker.createContainer({
    ...options,
    Entrypoint: [],
    OpenStdin: true,
    StdinOnce: stdinOnce,
    AttachStdin: true,
    AttachStdout: true,
    AttachStderr: true,
  });
  try {
    return { container, stream: await attachWhole(container) };
  } catch (err) {
    await container.remove({ force: true, v: true }).catch(() => undefined);
    throw err;
  }
}

/** The container's stdin, stdout and stderr as one stream (output multiplexed, as the engine sends it). */
export async function attachWhole(container: Docker.Container): Promise<NodeJS.ReadWriteStream> {
  return (await container.attach({ stream: true, stdin: true, stdout: true, stderr: true, hijack: true })) as NodeJS.ReadWriteStream;
}
