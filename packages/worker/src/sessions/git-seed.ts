import { spawn } from "node:child_process";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { type AgentDefinition, BoxcarError, ErrorCode, type GitSeed } from "@boxcar/protocol";
import { signalGroup } from "../sandbox/process-group.js";
import { type WorkspaceLimits, WorkspaceQuota } from "../workspace/workspace-quota.js";

/** How long a clone may take: within the 120 s a dispatcher waits for a session to open. */
const CLONE_TIMEOUT_MS = 90_000;

/**
 * Clones `seed` into the empty folder `dir` with the worker's `git`, before anything of the
 * session runs (docs/sessions.md#git). Only from the hosts the agent's `git.hosts` lists (with
 * their ports), over https or git, following no redirect; with the agent's `git.credential` (a
 * worker secret) sent to those hosts only,
 * through the environment of this one command, so it is written nowhere in the workspace. No
 * configuration of the worker's user or system is read, symlinks are checked out as plain files,
 * and submodules are not fetched. Returns the commit checked out.
 */
export async function cloneInto(
  seed: GitSeed,
  dir: string,
  agent: AgentDefinition,
  secretsEnv: Readonly<Record<string, string | undefined>>,
  limits: WorkspaceLimits,
): Promise<{ commit: string }> {
  let url: URL;
  try {
    url = new URL(seed.url);
  } catch {
    throw new BoxcarError(ErrorCode.invalid, `git.url ${JSON.stringify(seed.url)} is not a URL`);
  }
  const allowed = agent.git?.hosts ?? [];
  // The host with its port, as written: a bare name allows that name on the scheme's own port only.
  if (!allowed.includes(url.host)) {
    throw new BoxcarError(
      ErrorCode.forbidden,
      allowed.length === 0
        ? `agent ${agent.name} allows no git seeding: an admin lists the hosts under git.hosts`
        : `agent ${agent.name} clones only from ${allowed.join(", ")}, not ${url.host}`,
    );
  }
  const env: Record<string, string> = {
    PATH: process.env.PATH ?? "/usr/bin:/bin",
    LANG: "C.UTF-8",
    GIT_TERMINAL_PROMPT: "0",
    GIT_CONFIG_NOSYSTEM: "1",
    GIT_CONFIG_GLOBAL: "/dev/null",
    GIT_ALLOW_PROTOCOL: "https:git",
    // The worker's own choice of certificate authorities (a private git server's), if it has one.
    ...(process.env.GIT_SSL_CAINFO ? { GIT_SSL_CAINFO: process.env.GIT_SSL_CAINFO } : {}),
  };
  const secret = agent.git?.credential;
  let token: string | undefined;
  if (secret !== undefined) {
    token = Object.hasOwn(secretsEnv, secret) ? secretsEnv[secret] : undefined;
    if (token === undefined) {
      throw new BoxcarError(ErrorCode.missingSecret, `git.credential ${secret} is not on this worker's secrets allow-list, or not set`);
    }
    if (url.protocol === "https:") {
      // For the repository's host only (a URL-matched setting), from this command's environment.
      const basic = Buffer.from(`x-access-token:${token}`).toString("base64");
      Object.assign(env, {
        GIT_CONFIG_COUNT: "1",
        GIT_CONFIG_KEY_0: `http.https://${url.host}/.extraHeader`,
        GIT_CONFIG_VALUE_0: `Authorization: Basic ${basic}`,
      });
    }
  }
  // HOME is an empty folder of its own: nothing of the worker's user (a ~/.gitconfig, credentials) is read.
  const home = await mkdtemp(join(tmpdir(), "boxcar-git-"));
  env.HOME = home;
  try {
    // No redirects: a listed host must not send the clone, and the credential, to another one.
    const args = [
      ...["-c", "core.symlinks=false", "-c", "protocol.file.allow=never", "-c", "http.followRedirects=false"],
      ...["clone", "--no-recurse-submodules", "--quiet"],
    ];
    if (seed.depth !== undefined) args.push("--depth", String(seed.depth));
    if (seed.ref !== undefined) args.push("--branch", seed.ref);
    await git([...args, "--", seed.url, "."], dir, env, token, limits);
    const commit = (await git(["rev-parse", "HEAD"], dir, env, token, limits)).trim();
    return { commit };
  } finally {
    await rm(home, { recursive: true, force: true });
  }
}

/** Runs git in `dir`; its stdout, or a refusal naming what git said (the credential left out). */
function git(
  args: string[],
  dir: string,
  env: Record<string, string>,
  token: string | undefined,
  limits: WorkspaceLimits,
): Promise<string> {
  return new Promise((resolve, reject) => {
    const child = spawn("git", args, { cwd: dir, env, detached: true, stdio: ["ignore", "pipe", "pipe"] });
    let stdout = "";
    let stderr = "";
    let stopped: string | undefined;
    const stop = (why: string) => {
      stopped ??= why;
      if (child.pid !== undefined) signalGroup(child.pid, "SIGKILL");
    };
    const timer = setTimeout(() => stop(`the clone took more than ${CLONE_TIMEOUT_MS / 1000} s`), CLONE_TIMEOUT_MS);
    // A repository larger than the workspace may hold is stopped as it comes, not once it is all on disk.
    const quota = new WorkspaceQuota(dir, limits, (reason) => stop(`${reason} while cloning`));
    child.stdout.on("data", (chunk: Buffer) => {
      stdout = (stdout + chunk.toString()).slice(-64 * 1024);
    });
    child.stderr.on("data", (chunk: Buffer) => {
      stderr = (stderr + chunk.toString()).slice(-4_000);
    });
    const done = () => {
      clearTimeout(timer);
      quota.stop();
    };
    child.once("error", (err) => {
      done();
      const missing = (err as NodeJS.ErrnoException).code === "ENOENT";
      reject(new BoxcarError(ErrorCode.noSandbox, missing ? "git is not installed on this worker" : `cannot run git: ${err.message}`));
    });
    child.once("close", (code) => {
      done();
      if (code === 0 && stopped === undefined) return resolve(stdout);
      const said = (token ? stderr.replaceAll(token, "***") : stderr).trim().split("\n").slice(-3).join(" ");
      reject(new BoxcarError(ErrorCode.invalid, `git ${args.includes("clone") ? "clone" : args[0]} failed: ${stopped ?? said}`));
    });
  });
}
