import type { ChildProcess } from "node:child_process";
import { randomBytes } from "node:crypto";
import { mkdir, readdir, readFile, realpath, rm } from "node:fs/promises";
import { isAbsolute, join, relative, resolve } from "node:path";
import { ConnectError } from "./connect.js";

/** What a template gives its sandboxes. The stand-in reports these numbers and enforces neither. */
export interface StandInTemplate {
  cpuCount: number;
  memoryMB: number;
}

export type StandInSandboxState = "running" | "killed";

/** Why a sandbox was killed: the API was asked to, its timeout passed, or the stand-in closed. */
export type KillReason = "request" | "timeout" | "shutdown";

export interface SandboxCreation {
  templateId: string;
  template: StandInTemplate;
  metadata: Record<string, string>;
  envVars: Record<string, string>;
  timeoutSeconds: number;
  allowInternetAccess: boolean | undefined;
  /** Its egress rules, as E2B's API takes them (kept, not enforced: the stand-in's processes are the test's own). */
  network?: { allowOut?: string[]; denyOut?: string[] };
}

/** A process the daemon started; `stopOutput` ends its data events (envd does so on SIGKILL/SIGTERM). */
export interface StandInProcess {
  child: ChildProcess;
  stopOutput(): void;
}

/**
 * One sandbox: a real folder on this machine (its user's home is `<root>/home/user`) and the
 * real processes started in it. Nothing is isolated: processes run as the test machine's user
 * and see its whole filesystem; only the daemon's file calls are confined to the folder.
 */
export class StandInSandbox {
  readonly envdAccessToken = randomBytes(16).toString("hex");
  readonly startedAt = new Date();
  readonly templateId: string;
  readonly template: StandInTemplate;
  readonly metadata: Readonly<Record<string, string>>;
  readonly envVars: Readonly<Record<string, string>>;
  readonly allowInternetAccess: boolean | undefined;
  readonly network: { allowOut?: string[]; denyOut?: string[] } | undefined;
  /** Every lifetime the API was given, in seconds: at creation, then each set-timeout call. */
  readonly timeouts: number[] = [];
  readonly processes = new Map<number, StandInProcess>();
  /** The process config of every start request, as received (what envd would log). */
  readonly started: object[] = [];
  /** Run when the sandbox is killed: the daemon drops its open connections, as a gone VM does. */
  readonly onKill = new Set<() => void>();
  /** Every pid started here, so a kill also reaches the process groups they lead. */
  private readonly pids = new Set<number>();
  state: StandInSandboxState = "running";
  killedBy: KillReason | undefined;
  endAt: Date;
  private timer: NodeJS.Timeout | undefined;
  private removed: Promise<void> | undefined;

  private constructor(
    readonly id: string,
    readonly root: string,
    creation: SandboxCreation,
  ) {
    this.templateId = creation.templateId;
    this.template = creation.template;
    this.metadata = { ...creation.metadata };
    this.envVars = { ...creation.envVars };
    this.allowInternetAccess = creation.allowInternetAccess;
    this.network = creation.network;
    this.endAt = new Date();
    this.setTimeout(creation.timeoutSeconds);
  }

  /** A new sandbox with its own folder under `parent`. */
  static async create(parent: string, creation: SandboxCreation): Promise<StandInSandbox> {
    const id = `sbx${randomBytes(8).toString("hex")}`;
    const root = join(await realpath(parent), id);
    await mkdir(join(root, "home", "user"), { recursive: true });
    return new StandInSandbox(id, root, creation);
  }

  /** The sandbox user's home, where relative paths and commands without a cwd start. */
  get home(): string {
    return join(this.root, "home", "user");
  }

  /** Kills the sandbox `seconds` from now, as E2B does when a sandbox's timeout passes. */
  setTimeout(seconds: number): void {
    this.timeouts.push(seconds);
    clearTimeout(this.timer);
    this.endAt = new Date(Date.now() + seconds * 1000);
    this.timer = setTimeout(() => void this.kill("timeout"), seconds * 1000);
  }

  track(pid: number, process: StandInProcess): void {
    this.pids.add(pid);
    this.processes.set(pid, process);
  }

  /** Ends every process started here (and the process groups they lead) and removes the folder. */
  kill(reason: KillReason): Promise<void> {
    if (this.state === "running") {
      this.state = "killed";
      this.killedBy = reason;
      clearTimeout(this.timer);
      for (const dropConnection of this.onKill) dropConnection();
      for (const pid of this.pids) {
        signal(-pid);
        signal(pid);
      }
      this.removed = rm(this.root, { recursive: true, force: true });
    }
    return this.removed ?? Promise.resolve();
  }

  /**
   * Processes still alive that this sandbox started: the ones it tracks and every member of the
   * process groups they lead (read from /proc).
   */
  async alive(): Promise<number[]> {
    const found: number[] = [];
    for (const name of await readdir("/proc")) {
      if (!/^\d+$/.test(name)) continue;
      const stat = await readFile(`/proc/${name}/stat`, "utf8").catch(() => "");
      // pid (comm) state ppid pgrp ...: comm may hold spaces, so split after its closing parenthesis.
      const fields = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
      const pid = Number(name);
      const pgrp = Number(fields[2]);
      if (fields[0] !== "Z" && (this.pids.has(pid) || this.pids.has(pgrp))) found.push(pid);
    }
    return found;
  }

  /**
   * The real path of a sandbox path, as envd resolves it: `~` and relative paths start at the
   * user's home. Refuses paths outside the sandbox's folder (by spelling; symlinks are not
   * followed for this check).
   */
  resolvePath(path: string): string {
    const expanded = path === "~" || path.startsWith("~/") ? join(this.home, path.slice(1)) : path;
    const absolute = isAbsolute(expanded) ? resolve(expanded) : resolve(this.home, expanded);
    const inside = relative(this.root, absolute);
    if (inside.startsWith("..") || isAbsolute(inside)) {
      throw new ConnectError(
        "permission_denied",
        `the stand-in confines sandbox ${this.id} to its folder ${this.root}; ${JSON.stringify(path)} is outside it`,
      );
    }
    return absolute;
  }
}

function signal(pid: number): void {
  try {
    process.kill(pid, "SIGKILL");
  } catch {
    // already gone
  }
}
