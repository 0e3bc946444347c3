import { randomBytes } from "node:crypto";
import { PassThrough } from "node:stream";
import type Docker from "dockerode";
import type { LocalWorkspace } from "../../workspace/local-workspace.js";
import { type AttemptLease, beatLine, LIFELINE_FROM_STDIN, SENTINEL, stopSeconds } from "../lifeline.js";
import { shellQuote } from "../shell-word.js";
import { createAttached } from "./attached-container.js";

/**
 * A warm container's command: it waits for its job's script on stdin, up to a line that is `end`
 * (a random word of the container's), and runs it; the rest of stdin is then the agent's lifeline
 * (lifeline.ts). A stdin that ends first runs nothing (its worker is gone). Nothing of the job
 * (command, environment, secrets) is in the container's configuration, so `docker inspect` shows
 * none of it.
 */
export function warmCommand(end: string): string[] {
  const read = [
    "boxcar_script=; boxcar_ready=",
    'while IFS= read -r boxcar_line; do if [ "$boxcar_line" = "$0" ]; then boxcar_ready=1; break; fi; boxcar_script="$boxcar_script$boxcar_line',
    '"; done',
    '[ -n "$boxcar_ready" ] && eval "$boxcar_script"',
  ].join("\n");
  return ["/bin/sh", "-c", read, end];
}

/**
 * What the helper says when the agent has ended: its exit code. It is the agent's own word (it
 * runs as the shell's user and can read the shell's memory), so it only ever ends the agent's
 * run sooner: the worker then kills the container and waits for it to stop before reading
 * anything, and asks the engine, never the report, whether the kernel killed it for memory.
 */
export interface HelperReport {
  exitCode: number;
}

const SHELL_NAME = /^[A-Za-z_][A-Za-z0-9_]*$/;

/** The most a report's exit code may take: past it the line is cut and read as it is. */
const MAX_REPORT_BYTES = 16;

/** Starts every report: a control character agents' output hardly ever ends a chunk with. */
const REPORT_START = "\u001e";

/**
 * The script a warm container runs for one job: the environment, the sentinel of the agent's
 * lifeline (the rest of stdin; `waitMs`: how long its first beat may take), then the agent with an
 * empty stdin (as in a cold container), run by `exec` in a subshell so its name is looked up on
 * PATH as in a cold container (never a shell built-in), then, on both output streams, a report:
 * `REPORT_START`, `nonce`, the agent's exit code. Both streams carry it so each is known to be
 * complete: the engine reads them apart and may pass on one before the other.
 */
export function jobScript(argv: string[], env: Readonly<Record<string, string>>, nonce: string, waitMs?: number): string {
  const exports = Object.entries(env).map(([name, value]) => {
    if (!SHELL_NAME.test(name)) throw new Error(`environment variable name ${JSON.stringify(name)} is not a shell name`);
    return `export ${name}=${shellQuote(value)}`;
  });
  return [
    ...exports,
    `boxcar_stop_s=${shellQuote(stopSeconds(waitMs))}`,
    LIFELINE_FROM_STDIN,
    SENTINEL,
    `(exec ${argv.map(shellQuote).join(" ")}) 3<&-`,
    "boxcar_code=$?",
    `printf '\\036%s %s\\n' ${nonce} "$boxcar_code"`,
    `printf '\\036%s %s\\n' ${nonce} "$boxcar_code" >&2`,
    "",
  ].join("\n");
}

/**
 * Finds the helper's report at the end of one output stream. {@link take} returns what is the
 * agent's own output, holding back a tail that could be the start of the report; after the
 * report nothing more is output (a cold container's stream ends with its agent too).
 */
export class ReportScanner {
  private readonly marker: Buffer;
  private held: Buffer = Buffer.alloc(0);
  private after: Buffer | undefined;
  /** Set once the whole report line has come. */
  report: HelperReport | undefined;

  constructor(nonce: string) {
    this.marker = Buffer.from(`${REPORT_START}${nonce} `);
  }

  take(chunk: Buffer): Buffer {
    if (this.after) {
      // The rest of the report line, and nothing past it (kept short: an agent that forged a
      // report could go on writing without bound).
      if (!this.report) this.readReport(Buffer.concat([this.after, chunk]).subarray(0, MAX_REPORT_BYTES));
      return Buffer.alloc(0);
    }
    const data = this.held.length > 0 ? Buffer.concat([this.held, chunk]) : chunk;
    const at = data.indexOf(this.marker);
    if (at >= 0) {
      this.held = Buffer.alloc(0);
      this.readReport(data.subarray(at + this.marker.length));
      return data.subarray(0, at);
    }
    const keep = this.partialMarkerAtEnd(data);
    this.held = Buffer.from(data.subarray(data.length - keep));
    return data.subarray(0, data.length - keep);
  }

  /** What was held back, once the stream ended without a report. */
  rest(): Buffer {
    const rest = this.after ? Buffer.alloc(0) : this.held;
    this.held = Buffer.alloc(0);
    return rest;
  }

  private readReport(data: Buffer): void {
    this.after = data;
    const newline = data.indexOf(0x0a);
    if (newline < 0 && data.length < MAX_REPORT_BYTES) return;
    const code = Number(data.subarray(0, newline < 0 ? data.length : newline).toString());
    this.report = { exitCode: Number.isInteger(code) ? code : 255 };
    this.after = Buffer.alloc(0);
  }

  /** The length of the longest end of `data` that begins the marker. */
  private partialMarkerAtEnd(data: Buffer): number {
    for (let n = Math.min(this.marker.length - 1, data.length); n > 0; n--) {
      if (data.subarray(data.length - n).equals(this.marker.subarray(0, n))) return n;
    }
    return 0;
  }
}

/** What a job run in a warm container gives back. */
export interface WarmRun {
  /** The helper's report once both streams carried it; undefined when the output ended without one (the helper was killed). */
  report: Promise<HelperReport | undefined>;
}

/**
 * A hardened container, created and started before its job is known, running {@link warmCommand}
 * with its workspace folder bind-mounted and its output attached. It takes one job and is then
 * destroyed: never reused.
 */
export class WarmContainer {
  private readonly stdout = new PassThrough();
  private readonly stderr = new PassThrough();
  private settle: (() => void) | undefined;
  private onOutput: ((stream: "stdout" | "stderr", chunk: Uint8Array) => void) | undefined;
  private readonly scanners: Record<"stdout" | "stderr", ReportScanner | undefined> = { stdout: undefined, stderr: undefined };
  /** Resolves when the attach stream ends: the container stopped (before its job, it died). */
  readonly ended: Promise<void>;

  private constructor(
    readonly sandboxId: string,
    readonly container: Docker.Container,
    readonly files: LocalWorkspace,
    /** The limits it was made with; a job with others has them set when it takes the container. */
    readonly limits: { cpus: number; memory: number; pids: number },
    /** The PATH its image gives processes. */
    readonly agentPath: string,
    private readonly stream: NodeJS.ReadWriteStream,
    docker: Docker,
    /** The line that ends a job's script on its stdin. */
    private readonly scriptEnd: string,
  ) {
    docker.modem.demuxStream(stream, this.stdout, this.stderr);
    this.stdout.on("data", (chunk: Buffer) => this.output("stdout", chunk));
    this.stderr.on("data", (chunk: Buffer) => this.output("stderr", chunk));
    this.ended = new Promise<void>((resolve) => {
      stream.once("end", resolve);
      stream.once("close", resolve);
      stream.once("error", () => resolve());
    });
  }

  /** Creates, attaches and starts one; on any failure what was made is removed. */
  static async start(
    docker: Docker,
    sandboxId: string,
    options: Docker.ContainerCreateOptions,
    files: LocalWorkspace,
    limits: { cpus: number; memory: number; pids: number },
    agentPath: string,
  ): Promise<WarmContainer> {
    const end = `boxcar-script-end-${randomBytes(12).toString("hex")}`;
    const { container, stream } = await createAttached(docker, { ...options, Cmd: warmCommand(end) }, true);
    try {
      const warm = new WarmContainer(sandboxId, container, files, limits, agentPath, stream, docker, end);
      await container.start();
      return warm;
    } catch (err) {
      await container.remove({ force: true, v: true }).catch(() => undefined);
      throw err;
    }
  }

  /**
   * Hands the job to the helper: its output goes to `onOutput`, then comes the report. Its stdin
   * stays open as the agent's lifeline, beating with `lease` while the container runs.
   */
  run(
    argv: string[],
    env: Readonly<Record<string, string>>,
    onOutput: (stream: "stdout" | "stderr", chunk: Uint8Array) => void,
    lease?: AttemptLease,
  ): WarmRun {
    const nonce = `boxcar-exit-${randomBytes(12).toString("hex")}`;
    this.scanners.stdout = new ReportScanner(nonce);
    this.scanners.stderr = new ReportScanner(nonce);
    this.onOutput = onOutput;
    const report = new Promise<HelperReport | undefined>((resolve) => {
      this.settle = () => {
        const { stdout, stderr } = this.scanners;
        if (stdout?.report && stderr?.report) resolve(stderr.report);
      };
      void this.ended.then(() => {
        for (const name of ["stdout", "stderr"] as const) {
          const rest = this.scanners[name]?.rest();
          if (rest?.length) onOutput(name, rest);
        }
        resolve(this.scanners.stderr?.report);
      });
    });
    // The end line starts the job: the helper reads the script up to it.
    this.stream.write(`${jobScript(argv, env, nonce, lease?.msLeft())}${this.scriptEnd}\n`);
    const stopBeating = lease?.onRenewed((msLeft) => this.stream.write(beatLine(msLeft)));
    void this.ended.then(() => stopBeating?.());
    return { report };
  }

  private output(name: "stdout" | "stderr", chunk: Buffer): void {
    const scanner = this.scanners[name];
    if (!scanner || !this.onOutput) return;
    const own = scanner.take(chunk);
    if (own.length > 0) this.onOutput(name, own);
    if (scanner.report) this.settle?.();
  }
}

/** What the pool needs from the Docker backend. */
export interface WarmMaker {
  /** Makes one warm container for `key`. */
  make(key: WarmKey): Promise<WarmContainer>;
  /** Removes a warm container and its folder. */
  discard(warm: WarmContainer): Promise<void>;
}

/** What warm containers are made for: an image and a network (limits are set when a job takes one). */
export interface WarmKey {
  image: string;
  network: string;
}

const keyText = (key: WarmKey) => `${key.image}\u0000${key.network}`;

/**
 * Keeps up to `size` started containers ready for each (image, network) a job has asked for,
 * each handed to one job only. A key whose container failed to be made, or died before any job
 * took it, is not filled again for a minute; a key no job asked for in `idleMs` is emptied.
 */
export class WarmPool {
  private readonly ready = new Map<string, WarmContainer[]>();
  private readonly making = new Map<string, number>();
  private readonly lastAsked = new Map<string, { key: WarmKey; at: number }>();
  private readonly coolingUntil = new Map<string, number>();
  /** Makes under way, which close() waits for. */
  private readonly inFlight = new Set<Promise<void>>();
  private readonly sweeper: NodeJS.Timeout;
  private closed = false;

  constructor(
    private readonly maker: WarmMaker,
    readonly size: number,
    private readonly onError: (err: unknown) => void,
    private readonly idleMs = 10 * 60_000,
  ) {
    this.sweeper = setInterval(() => void this.dropIdle(), Math.min(60_000, idleMs)).unref();
  }

  /** A ready container for `key`, if there is one; either way the key is filled up again. */
  take(key: WarmKey): WarmContainer | undefined {
    const text = keyText(key);
    this.lastAsked.set(text, { key, at: Date.now() });
    const warm = this.ready.get(text)?.shift();
    this.fill(key);
    return warm;
  }

  /** How many containers stand ready for `key`. */
  readyFor(key: WarmKey): number {
    return this.ready.get(keyText(key))?.length ?? 0;
  }

  /** How many containers stand ready, over all keys. */
  get readyCount(): number {
    let n = 0;
    for (const list of this.ready.values()) n += list.length;
    return n;
  }

  /** Makes containers for `key` until `size` are ready or being made. */
  fill(key: WarmKey): void {
    const text = keyText(key);
    if (this.closed || (this.coolingUntil.get(text) ?? 0) > Date.now()) return;
    if (!this.ready.has(text)) this.ready.set(text, []);
    this.lastAsked.set(text, this.lastAsked.get(text) ?? { key, at: Date.now() });
    while ((this.ready.get(text)?.length ?? 0) + (this.making.get(text) ?? 0) < this.size) {
      this.making.set(text, (this.making.get(text) ?? 0) + 1);
      const made = this.maker.make(key).then(
        (warm) => this.keep(key, warm),
        (err: unknown) => {
          this.coolingUntil.set(text, Date.now() + COOL_DOWN_MS);
          this.onError(err);
        },
      );
      this.inFlight.add(made);
      void made.finally(() => {
        this.inFlight.delete(made);
        this.making.set(text, (this.making.get(text) ?? 1) - 1);
      });
    }
  }

  /** Removes every ready container, and those still being made once they are; the pool makes no more. */
  async close(): Promise<void> {
    this.closed = true;
    clearInterval(this.sweeper);
    const all = [...this.ready.values()].flatMap((list) => list.splice(0));
    await Promise.all([...all.map((warm) => this.maker.discard(warm).catch(this.onError)), ...this.inFlight]);
  }

  /** Puts a container just made among `key`'s ready ones, unless the pool closed or dropped the key meanwhile. */
  private async keep(key: WarmKey, warm: WarmContainer): Promise<void> {
    const text = keyText(key);
    const list = this.ready.get(text);
    if (this.closed || !list) return this.maker.discard(warm).catch(this.onError);
    list.push(warm);
    // Died before a job took it (an image without /bin/sh, an engine restart): out of the pool.
    void warm.ended.then(async () => {
      const at = list.indexOf(warm);
      if (at < 0) return;
      list.splice(at, 1);
      this.coolingUntil.set(text, Date.now() + COOL_DOWN_MS);
      this.onError(new Error(`a warm container for ${key.image} (network ${key.network}) stopped before any job took it`));
      await this.maker.discard(warm).catch(this.onError);
    });
  }

  private async dropIdle(): Promise<void> {
    const now = Date.now();
    for (const [text, { at }] of this.lastAsked) {
      if (now - at < this.idleMs) continue;
      this.lastAsked.delete(text);
      const list = this.ready.get(text)?.splice(0) ?? [];
      this.ready.delete(text);
      await Promise.all(list.map((warm) => this.maker.discard(warm).catch(this.onError)));
    }
  }
}

const COOL_DOWN_MS = 60_000;
