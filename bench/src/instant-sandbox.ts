import { createHostSandboxProvider, type ExecResult, type Sandbox, type SandboxProvider, type WorkspaceFile } from "@boxcar/worker";

/**
 * BENCH ONLY. Sandbox providers whose `exec` returns exit code 0 at once, without starting a
 * process: the worker still runs its whole path around it (claim, events, workspace layout,
 * result file, artifacts, final record, ack), so what is left is Boxcar's own overhead.
 * Both report kind `host`, so an agent with `sandbox: host` is placed on them.
 *
 * - `host-files`: a real host sandbox (temporary folder, files on disk) with only the process
 *   spawn taken out: the host path minus the spawn.
 * - `memory`: the workspace is a map in memory: no file system either.
 */
export function createInstantSandboxProvider(workspace: "host-files" | "memory", root: string): SandboxProvider {
  const host = createHostSandboxProvider({ root });
  return {
    kind: "host",
    available: async () => true,
    async create(spec, signal) {
      signal?.throwIfAborted();
      return workspace === "memory" ? new MemorySandbox(spec.id) : new NoSpawnSandbox(await host.create(spec, signal));
    },
  };
}

const exitedAtOnce = (signal: AbortSignal): Promise<ExecResult> =>
  Promise.resolve({ exitCode: signal.aborted ? null : 0, signal: null, aborted: signal.aborted, durationMs: 0 });

/** A host sandbox whose exec starts nothing. */
class NoSpawnSandbox implements Sandbox {
  readonly kind = "host";
  constructor(private readonly inner: Sandbox) {}
  get id() {
    return this.inner.id;
  }
  get workspace() {
    return this.inner.workspace;
  }
  exec(_argv: string[], opts: { signal: AbortSignal }) {
    return exitedAtOnce(opts.signal);
  }
  mkdir(path: string) {
    return this.inner.mkdir(path);
  }
  writeFile(path: string, data: Uint8Array | ReadableStream<Uint8Array>) {
    return this.inner.writeFile(path, data);
  }
  readFile(path: string) {
    return this.inner.readFile(path);
  }
  listFiles() {
    return this.inner.listFiles();
  }
  destroy() {
    return this.inner.destroy();
  }
}

/** A workspace held in memory; exec starts nothing. */
class MemorySandbox implements Sandbox {
  readonly kind = "host";
  readonly workspace: string;
  private readonly files = new Map<string, Uint8Array>();

  constructor(readonly id: string) {
    this.workspace = `/memory/${id}`;
  }

  exec(_argv: string[], opts: { signal: AbortSignal }) {
    return exitedAtOnce(opts.signal);
  }

  async mkdir(_path: string): Promise<void> {}

  async writeFile(path: string, data: Uint8Array | ReadableStream<Uint8Array>): Promise<void> {
    this.files.set(path, data instanceof Uint8Array ? data : new Uint8Array(await new Response(data).arrayBuffer()));
  }

  async readFile(path: string): Promise<ReadableStream<Uint8Array> | null> {
    const data = this.files.get(path);
    if (!data) return null;
    return new ReadableStream({
      start(controller) {
        controller.enqueue(data);
        controller.close();
      },
    });
  }

  async listFiles(): Promise<WorkspaceFile[]> {
    return [...this.files].map(([path, data]) => ({ path, size: data.length }));
  }

  async destroy(): Promise<void> {
    this.files.clear();
  }
}
