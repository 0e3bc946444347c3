/**
 * A background process's stdin kept open for `sessions.input` (docs/sessions.md#background-processes).
 * A Docker session's helper keeps the pipe to the command open when its start names an input key
 * (`BOXCAR_HELPER_STDIN`, taken out of its environment), and writes to it when asked
 * (`boxcar-helper input KEY`): the input goes inside the container, as the session's files do. A
 * host session's command reads a named pipe this worker writes to, in a private folder, the
 * command started through `sh` with its stdin from it. An E2B session's is not built yet.
 */

import { execFile } from "node:child_process";
import { closeSync, constants, open, openSync } from "node:fs";
import { chmod, mkdtemp, rm } from "node:fs/promises";
import { Socket } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { promisify } from "node:util";
import { BoxcarError, ErrorCode } from "@boxcar/protocol";
import type { SessionSandbox } from "../sandbox/sandbox.js";
import { askHelper, notBuilt } from "./helper-verbs.js";

/** How long a process has to take what is written to its stdin (a pipe holds 64 KiB) before the input is refused. */
const INPUT_TIMEOUT_MS = 30_000;

/** The open stdin of one process: how to start it, and what writes to it. */
export interface ProcessStdin {
  /** What to run: the command (Docker), or `sh` starting it with its stdin from the pipe (host). */
  readonly argv: string[];
  /** Added to its environment (the helper's input key, which the helper takes out). */
  readonly env: Readonly<Record<string, string>>;
  /** Its first `stdin` goes with its start (the helper writes it and keeps the pipe open); else through `write` once it started. */
  readonly firstWithStart: boolean;
  /** Resolves once its stdin took `data` (refused when it did not within `INPUT_TIMEOUT_MS`, or its stdin is gone). */
  write(data: Uint8Array): Promise<void>;
  /** Closes it: the process reads the end of its input. */
  end(): Promise<void>;
  /** The process ended: lets go of what its stdin held. */
  dispose(): void;
}

/** An open stdin for the process `execId` that will run `argv` in the session. */
export async function openStdin(sandbox: SessionSandbox, execId: string, argv: readonly string[]): Promise<ProcessStdin> {
  const { kind } = sandbox;
  if (kind === "docker") return helperStdin(sandbox, execId, argv);
  if (kind === "host") return pipeStdin(execId, argv);
  throw notBuilt(kind, "a process's open stdin (openStdin)");
}

function helperStdin(sandbox: SessionSandbox, execId: string, argv: readonly string[]): ProcessStdin {
  const ask = async (args: string[], data?: Uint8Array) => {
    const answer = await askHelper(sandbox, ["input", execId, ...args], {
      timeoutMs: INPUT_TIMEOUT_MS,
      ...(data ? { stdin: data } : {}),
    }).catch((err: unknown) => {
      if (err instanceof BoxcarError && err.code === ErrorCode.unavailable) throw notTaken(execId);
      throw err;
    });
    if (answer.code !== 0) throw new BoxcarError(ErrorCode.conflict, `${execId} takes no input: ${answer.stderr || "its stdin is closed"}`);
  };
  return {
    argv: [...argv],
    env: { BOXCAR_HELPER_STDIN: execId },
    firstWithStart: true,
    write: (data) => ask([], data),
    end: () => ask(["--end"]),
    dispose: () => {},
  };
}

/**
 * A named pipe in a private folder of this worker's: the command's `sh` opens it for reading, and
 * this side opens it for writing once it has (an open for writing waits for a reader, in the
 * thread pool), so the end of the input is never said before the command reads it: a pipe's
 * bytes are dropped when its last end closes, and a reader opening it later would wait for ever.
 */
async function pipeStdin(execId: string, argv: readonly string[]): Promise<ProcessStdin> {
  const dir = await mkdtemp(join(tmpdir(), "boxcar-stdin-"));
  const fifo = join(dir, "stdin");
  try {
    // A host session's commands may run as another user (the worker's hostUser): it may open the
    // pipe by its name, not list the folder.
    await chmod(dir, 0o711);
    await promisify(execFile)("mkfifo", ["-m", "0644", fifo]);
  } catch (err) {
    await rm(dir, { recursive: true, force: true });
    throw err;
  }
  let released = false;
  const opened = promisify(open)(fifo, constants.O_WRONLY).then((fd) => {
    const pipe = new Socket({ fd, readable: false, writable: true });
    pipe.on("error", () => {});
    if (released) pipe.destroy();
    return pipe;
  });
  opened.catch(() => {});
  /** The pipe once the command has opened it, within the input's time. */
  const writable = () =>
    new Promise<Socket>((resolve, reject) => {
      const timer = setTimeout(() => reject(notTaken(execId)), INPUT_TIMEOUT_MS);
      opened.then(
        (pipe) => {
          clearTimeout(timer);
          if (released) reject(new BoxcarError(ErrorCode.conflict, `${execId} has ended: it takes no more input`));
          else resolve(pipe);
        },
        (err: Error) => {
          clearTimeout(timer);
          reject(new BoxcarError(ErrorCode.conflict, `${execId} takes no input: ${err.message}`));
        },
      );
    });
  return {
    argv: ["/bin/sh", "-c", 'exec "$@" <"$0"', fifo, ...argv],
    env: {},
    firstWithStart: false,
    write: async (data) => {
      const pipe = await writable();
      await new Promise<void>((resolve, reject) => {
        const timer = setTimeout(() => reject(notTaken(execId)), INPUT_TIMEOUT_MS);
        pipe.write(data, (err) => {
          clearTimeout(timer);
          if (err) reject(new BoxcarError(ErrorCode.conflict, `${execId} takes no input: ${err.message}`));
          else resolve();
        });
      });
    },
    end: async () => {
      const pipe = await writable();
      await new Promise<void>((resolve) => pipe.end(resolve));
      pipe.destroy();
    },
    dispose: () => {
      released = true;
      // An open for writing still waiting (the command never opened the pipe) is let go: a reader
      // of its own, at once closed.
      try {
        closeSync(openSync(fifo, constants.O_RDONLY | constants.O_NONBLOCK));
      } catch {
        // removed already
      }
      void opened.then((pipe) => pipe.destroy()).catch(() => {});
      void rm(dir, { recursive: true, force: true }).catch(() => {});
    },
  };
}

function notTaken(execId: string): BoxcarError {
  return new BoxcarError(
    ErrorCode.conflict,
    `${execId} did not read its input within ${INPUT_TIMEOUT_MS / 1000} s: what was sent waits in its stdin; send more once it reads`,
  );
}
