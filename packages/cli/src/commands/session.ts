import { createReadStream } from "node:fs";
import { constants } from "node:os";
import {
  BoxcarError,
  ErrorCode,
  MAX_EXEC_STDIN,
  MAX_PROCESS_INPUT,
  MAX_SESSION_FILE_BYTES,
  names,
  Port,
  SessionState,
} from "@boxcar/protocol";
import type { Command } from "../command.js";
import { ExitCode } from "../exit-codes.js";
import { optionalDuration } from "../flags.js";
import { describeEvent, json, table } from "../output.js";
import { UsageError } from "../usage-error.js";

const usage = `boxcar session open AGENT [--from SNAPSHOT | --git URL [--ref REF] [--depth N] | --artifacts-of JOB] [--template NAME] [--idle 10m] [--lifetime 8h]
       boxcar session snapshot ID
       boxcar session exec ID [--timeout 10m] [--env NAME=VALUE]... [--cwd DIR] [--stdin FILE|-] -- COMMAND [ARG...]
       boxcar session start ID [--timeout 10m] [--env NAME=VALUE]... [--cwd DIR] [--stdin FILE|-] [--open-stdin] -- COMMAND [ARG...]   (in the background)
       boxcar session ps ID | wait ID EXEC [--timeout 30s] | kill ID EXEC | output ID EXEC [--stderr]
       boxcar session input ID EXEC [--keep-open]      (this shell's stdin to a process started with --open-stdin)
       boxcar session cancel ID | close ID | get ID | events ID [-f] | logs ID [-f]
       boxcar session pause ID [--timeout 1h] | resume ID   (every process of a Docker session held where it is, its memory
                                                    kept, until resumed; closed if still paused after --timeout, at most 24h)
       boxcar session ls ID [DIR] [--limit N] | read ID PATH | write ID PATH [--file FILE|-] [--executable] | rm ID PATH
       boxcar session cp LOCAL ID:PATH | cp ID:PATH LOCAL   (files and folders, any size, checked and resumed)
       boxcar session watch ID [PATH] [--timeout 1h]    (its changes as they come, until Ctrl-C)
       boxcar session port ID PORT [--local PORT] [--bind ADDRESS]   (a local port, default any free one on 127.0.0.1,
                                                    relaying each connection to PORT on the session's own loopback, until Ctrl-C)
       boxcar session shell ID [--env NAME=VALUE]... [--cwd DIR] [--timeout 8h] [-- COMMAND [ARG...]]
                                                   (this terminal, raw, on a shell in the session (bash, else sh; or COMMAND);
                                                    Ctrl-C and Ctrl-D go to it, its size follows; exits with its exit code,
                                                    255 when the connection ended first)`;

export const session: Command = {
  usage,
  maxArgs: Number.POSITIVE_INFINITY,
  options: {
    idle: { type: "string" },
    lifetime: { type: "string" },
    timeout: { type: "string" },
    env: { type: "string", multiple: true, default: [] },
    cwd: { type: "string" },
    stdin: { type: "string" },
    from: { type: "string" },
    git: { type: "string" },
    "artifacts-of": { type: "string" },
    template: { type: "string" },
    ref: { type: "string" },
    depth: { type: "string" },
    file: { type: "string", default: "-" },
    follow: { type: "boolean", short: "f", default: false },
    executable: { type: "boolean", default: false },
    limit: { type: "string" },
    stderr: { type: "boolean", default: false },
    "open-stdin": { type: "boolean", default: false },
    "keep-open": { type: "boolean", default: false },
    local: { type: "string" },
    bind: { type: "string" },
  },
  async run(ctx) {
    const [verb, first, ...rest] = ctx.positionals;
    const one = (what: string) => {
      if (!first || rest.length > 0) throw new UsageError(`session ${verb} needs one ${what}\n\nusage: ${usage}`);
      return first;
    };
    /** The session's id and one path: `ID PATH` (`optional`: the path may be left out). */
    const idAndPath = (optional = false): [string, string | undefined] => {
      if (!first || rest.length > 1 || (!optional && rest.length === 0)) {
        throw new UsageError(`session ${verb} needs an ID and ${optional ? "at most one" : "a"} PATH\n\nusage: ${usage}`);
      }
      return [first, rest[0]];
    };
    switch (verb) {
      case "open": {
        // The agent, or a snapshot (whose agent it then is), or both.
        const from = ctx.values.from as string | undefined;
        const agent = from !== undefined && !first ? undefined : one("AGENT");
        const git = gitSeed(ctx.values as { git?: string; ref?: string; depth?: string });
        const idle = optionalDuration(ctx.values.idle, "--idle");
        const lifetime = optionalDuration(ctx.values.lifetime, "--lifetime");
        await using s = await ctx.session("boxcar-session");
        const opened = await s.client.openSession({
          ...(agent !== undefined ? { agent } : {}),
          ...(from !== undefined ? { from } : {}),
          ...(git ? { git } : {}),
          ...(ctx.values["artifacts-of"] !== undefined ? { artifactsOf: ctx.values["artifacts-of"] as string } : {}),
          ...(ctx.values.template !== undefined ? { template: ctx.values.template as string } : {}),
          ...(idle !== undefined ? { idleTimeout: idle } : {}),
          ...(lifetime !== undefined ? { maxLifetime: lifetime } : {}),
        });
        ctx.print(ctx.values.json ? json(opened) : opened.id);
        return ExitCode.ok;
      }
      case "start": {
        if (!first || rest.length === 0) throw new UsageError(`session start needs an ID and, after --, a command\n\nusage: ${usage}`);
        const timeout = optionalDuration(ctx.values.timeout, "--timeout");
        const stdin =
          ctx.values.stdin === undefined ? undefined : await readInput(ctx.io, ctx.values.stdin as string, MAX_EXEC_STDIN, "--stdin");
        await using s = await ctx.session("boxcar-session");
        const started = await s.client.startInSession({
          id: first,
          argv: rest,
          env: envPairs(ctx.values.env as string[]),
          ...(timeout !== undefined ? { timeout } : {}),
          ...(ctx.values.cwd !== undefined ? { cwd: ctx.values.cwd as string } : {}),
          ...(stdin !== undefined ? { stdin: stdin.toString("base64") } : {}),
          ...(ctx.values["open-stdin"] ? { openStdin: true } : {}),
        });
        ctx.print(ctx.values.json ? json(started) : started.execId);
        return ExitCode.ok;
      }
      case "ps": {
        await using s = await ctx.session("boxcar-session");
        const processes = await s.client.sessionProcesses(one("session ID"));
        if (ctx.values.json) ctx.print(json(processes));
        else
          ctx.print(
            table(
              ["EXEC", "STATE", "EXIT", "STARTED", "COMMAND"],
              processes.map((p) => [
                p.execId,
                p.running
                  ? p.terminal
                    ? "running, terminal"
                    : p.stdin === "open"
                      ? "running, stdin open"
                      : "running"
                  : p.killed
                    ? "killed"
                    : p.timedOut
                      ? "timed out"
                      : "ended",
                p.running ? "" : String(p.exitCode ?? p.signal ?? ""),
                p.startedAt,
                p.argv.join(" ").slice(0, 60),
              ]),
            ),
          );
        return ExitCode.ok;
      }
      case "wait":
      case "kill":
      case "output": {
        if (!first || rest.length !== 1) throw new UsageError(`session ${verb} needs an ID and an EXEC id\n\nusage: ${usage}`);
        const execId = rest[0] as string;
        await using s = await ctx.session("boxcar-session");
        if (verb === "kill") {
          const killed = await s.client.killInSession(first, execId);
          ctx.print(ctx.values.json ? json(killed) : `${execId} ${killed.running ? "killed" : "had ended"}`);
          return ExitCode.ok;
        }
        if (verb === "output") {
          // A command's whole kept output (past the live window), as it wrote it.
          for await (const part of s.client.keptOutput(first, execId, ctx.values.stderr ? "stderr" : "stdout")) ctx.io.stdout.write(part);
          return ExitCode.ok;
        }
        const timeout = optionalDuration(ctx.values.timeout, "--timeout");
        const waited = await s.client.waitInSession({ id: first, execId, ...(timeout !== undefined ? { timeout } : {}) });
        if (ctx.values.json) ctx.print(json(waited));
        if (!waited.result) {
          if (!ctx.values.json) ctx.io.stderr.write(`${execId} still runs\n`);
          return ExitCode.jobFailed;
        }
        if (!ctx.values.json) {
          ctx.io.stdout.write(Buffer.from(waited.result.stdout, "base64"));
          ctx.io.stderr.write(Buffer.from(waited.result.stderr, "base64"));
        }
        return exitOf(waited.result);
      }
      case "input": {
        if (!first || rest.length !== 1) throw new UsageError(`session input needs an ID and an EXEC id\n\nusage: ${usage}`);
        const execId = rest[0] as string;
        if (!ctx.io.stdin) throw new UsageError("session input reads this command's stdin, and it has none");
        await using s = await ctx.session("boxcar-session");
        // As it comes (a line typed is sent at once), in parts a request carries; at its end the process's stdin ends too, unless --keep-open.
        let sent = 0;
        for await (const chunk of ctx.io.stdin) {
          const bytes = typeof chunk === "string" ? Buffer.from(chunk) : (chunk as Buffer);
          for (let at = 0; at < bytes.length; at += MAX_PROCESS_INPUT) {
            sent += (await s.client.inputInSession(first, execId, bytes.subarray(at, at + MAX_PROCESS_INPUT))).written;
          }
        }
        if (!ctx.values["keep-open"]) await s.client.inputInSession(first, execId, "", { close: true });
        if (ctx.values.json) ctx.print(json({ execId, written: sent, closed: !ctx.values["keep-open"] }));
        return ExitCode.ok;
      }
      case "cp": {
        if (!first || rest.length !== 1) throw new UsageError(`session cp needs a SOURCE and a DESTINATION\n\nusage: ${usage}`);
        const [from, to] = [first, rest[0] as string];
        const source = inSession(from);
        const target = inSession(to);
        if ((source === undefined) === (target === undefined)) {
          throw new UsageError(
            `session cp copies between here and a session: one of its two paths is ID:PATH (ses-...:src/main.py)\n\nusage: ${usage}`,
          );
        }
        await using s = await ctx.session("boxcar-session");
        const opts = { signal: ctx.io.signal };
        let copied: Awaited<ReturnType<typeof s.client.copyToSession>>;
        try {
          copied = source
            ? await s.client.copyFromSession(source.id, source.path, to, opts)
            : await s.client.copyToSession((target as { id: string }).id, from, (target as { path: string }).path, opts);
        } catch (err) {
          if (!ctx.io.signal.aborted) throw err;
          ctx.io.stderr.write("interrupted: the same copy again goes on from where it stopped\n");
          return ExitCode.jobFailed;
        }
        if (ctx.values.json) ctx.print(json(copied));
        else
          for (const file of copied) {
            const resumed = file.resumedFrom > 0 ? `, resumed at ${file.resumedFrom}` : "";
            ctx.print(
              `${source ? `${source.id}:${file.path} -> ${file.local}` : `${file.local} -> ${(target as { id: string }).id}:${file.path}`} (${file.size} bytes, sha256 ${file.sha256}${resumed})`,
            );
          }
        return ExitCode.ok;
      }
      case "watch": {
        const [id, path] = idAndPath(true);
        const timeout = optionalDuration(ctx.values.timeout, "--timeout") ?? 3_600_000;
        await using s = await ctx.session("boxcar-session");
        const watch = await s.client.watchSession({ id, ...(path !== undefined ? { path } : {}), timeout });
        ctx.io.stderr.write(`watching ${watch.path} in ${id} (${watch.folders} folders) until ${watch.endsAt}; Ctrl-C stops\n`);
        // Its changes as they come (the session's events, those of this watch), until Ctrl-C, its end or the session's.
        const until = AbortSignal.any([ctx.io.signal, AbortSignal.timeout(Math.max(0, Date.parse(watch.endsAt) - Date.now()))]);
        try {
          for await (const event of s.client.sessionEvents(id, { follow: true, signal: until })) {
            if (event.kind !== "session" || event.type !== "file_changed" || event.watchId !== watch.watchId) continue;
            ctx.print(ctx.values.json ? JSON.stringify(event) : `${event.change} ${event.path}`);
          }
        } finally {
          await s.client.unwatchSession(id, watch.watchId).catch(() => {});
        }
        return ExitCode.ok;
      }
      case "port": {
        if (!first || rest.length !== 1) throw new UsageError(`session port needs an ID and a PORT\n\nusage: ${usage}`);
        const id = first;
        const port = portOf(rest[0], "PORT");
        const local = ctx.values.local === undefined ? 0 : portOf(ctx.values.local as string, "--local", true);
        await using s = await ctx.session("boxcar-session");
        const held = await s.client.getSession(id);
        if (held.state !== "open")
          throw new BoxcarError(ErrorCode.conflict, `session ${id} is ${held.state}${held.reason ? ` (${held.reason})` : ""}`);
        await using forward = await s.client.forwardSessionPort(id, port, {
          localPort: local,
          ...(ctx.values.bind !== undefined ? { host: ctx.values.bind as string } : {}),
          onError: (err) => ctx.io.stderr.write(`a connection to port ${port} of ${id}: ${err.message}\n`),
        });
        const where = forward.host.includes(":") ? `[${forward.host}]:${forward.port}` : `${forward.host}:${forward.port}`;
        ctx.print(ctx.values.json ? JSON.stringify({ session: id, port, host: forward.host, localPort: forward.port }) : where);
        ctx.io.stderr.write(`${where} relays each connection to port ${port} of ${id}; Ctrl-C stops\n`);
        // Until Ctrl-C, or the session's end (which ends its connections).
        let reason: string | undefined;
        for await (const event of s.client.sessionEvents(id, { follow: true, signal: ctx.io.signal })) {
          if (event.kind === "session" && event.type === "closed") reason = event.reason ?? "closed";
        }
        if (ctx.io.signal.aborted) return ExitCode.ok;
        ctx.io.stderr.write(`session ${id} closed${reason ? ` (${reason})` : ""}: no more connections\n`);
        return ExitCode.refused;
      }
      case "shell": {
        if (!first) throw new UsageError(`session shell needs an ID\n\nusage: ${usage}`);
        return runShell(ctx, first, rest.length > 0 ? rest : undefined);
      }
      case "exec": {
        if (!first || rest.length === 0) throw new UsageError(`session exec needs an ID and, after --, a command\n\nusage: ${usage}`);
        const env = envPairs(ctx.values.env as string[]);
        const timeout = optionalDuration(ctx.values.timeout, "--timeout");
        const stdin =
          ctx.values.stdin === undefined ? undefined : await readInput(ctx.io, ctx.values.stdin as string, MAX_EXEC_STDIN, "--stdin");
        await using s = await ctx.session("boxcar-session");
        const request = {
          id: first,
          argv: rest,
          env,
          ...(timeout !== undefined ? { timeout } : {}),
          ...(ctx.values.cwd !== undefined ? { cwd: ctx.values.cwd as string } : {}),
          ...(stdin !== undefined ? { stdin: stdin.toString("base64") } : {}),
        };
        if (ctx.values.json) {
          ctx.print(json(await s.client.execInSession(request)));
          return ExitCode.ok;
        }
        // The output as it comes, from the session's log subject (one command runs at a time; the
        // output of processes in the background, told by their ids, is left out); the reply says
        // how it ended.
        const { owner } = await s.client.getSession(first);
        const background = new Set((await s.client.sessionProcesses(first)).filter((p) => p.running).map((p) => p.execId));
        const live = { stdout: 0, stderr: 0 };
        const sub = s.nc.subscribe(names(ctx.values.prefix).subjects.jobLogs(owner, first), {
          callback: (err, msg) => {
            if (err || background.has(msg.headers?.get("Boxcar-Exec") ?? "")) return;
            const stream = msg.subject.endsWith(".stderr") ? "stderr" : "stdout";
            live[stream] += msg.data.length;
            ctx.io[stream].write(msg.data);
          },
        });
        await s.nc.flush();
        // Ctrl-C stops the command, and this waits for it to say how it ended.
        const cancel = () => void s.client.cancelInSession(first).catch(() => {});
        ctx.io.signal.addEventListener("abort", cancel, { once: true });
        let ran: Awaited<ReturnType<typeof s.client.execInSession>>;
        try {
          ran = await s.client.execInSession(request);
          await s.nc.flush();
        } finally {
          ctx.io.signal.removeEventListener("abort", cancel);
          sub.unsubscribe();
        }
        // Nothing came live (a subscription refused): the reply's end of the output instead.
        if (live.stdout + live.stderr === 0 && !ran.kept) {
          ctx.io.stdout.write(Buffer.from(ran.stdout, "base64"));
          ctx.io.stderr.write(Buffer.from(ran.stderr, "base64"));
        }
        // Live output stops at 4 MiB a command; what it wrote past that was kept whole: the rest of each stream.
        for (const stream of ["stdout", "stderr"] as const) {
          const kept = ran.kept?.[stream];
          if (!kept) continue;
          for await (const part of s.client.keptOutput(first, ran.execId, stream, live[stream])) ctx.io[stream].write(part);
          if (kept.cut) ctx.io.stderr.write(`(${ran.execId}: its ${stream} past 256 MiB was not kept)\n`);
        }
        if (ran.timedOut) ctx.io.stderr.write(`${ran.execId} timed out\n`);
        if (ran.cancelled) ctx.io.stderr.write(`${ran.execId} cancelled\n`);
        return exitOf(ran);
      }
      case "snapshot": {
        await using s = await ctx.session("boxcar-session");
        const taken = await s.client.snapshotSession(one("ID"));
        ctx.print(ctx.values.json ? json(taken) : taken.id);
        return ExitCode.ok;
      }
      case "pause": {
        const timeout = optionalDuration(ctx.values.timeout, "--timeout");
        await using s = await ctx.session("boxcar-session");
        const paused = await s.client.pauseSession(one("ID"), timeout !== undefined ? { timeout } : {});
        ctx.print(ctx.values.json ? json(paused) : `paused ${paused.id} until it is resumed (closed at ${paused.pauseEndsAt} if not)`);
        return ExitCode.ok;
      }
      case "resume": {
        await using s = await ctx.session("boxcar-session");
        const resumed = await s.client.resumeSession(one("ID"));
        ctx.print(ctx.values.json ? json(resumed) : `resumed ${resumed.id}`);
        return ExitCode.ok;
      }
      case "cancel": {
        await using s = await ctx.session("boxcar-session");
        await s.client.cancelInSession(one("ID"));
        ctx.print(`cancelled the command running in ${first}`);
        return ExitCode.ok;
      }
      case "ls": {
        const [id, path] = idAndPath(true);
        await using s = await ctx.session("boxcar-session");
        const limit = ctx.values.limit === undefined ? undefined : Number(ctx.values.limit);
        if (limit !== undefined && !(Number.isInteger(limit) && limit >= 1 && limit <= 10_000)) {
          throw new UsageError(`--limit takes a whole number from 1 to 10000, got ${String(ctx.values.limit)}`);
        }
        const listed = await s.client.listSessionFiles({
          id,
          ...(path !== undefined ? { path } : {}),
          ...(limit !== undefined ? { limit } : {}),
        });
        if (ctx.values.json) ctx.print(json(listed));
        else {
          ctx.print(
            table(
              ["SIZE", "PATH"],
              listed.files.map((f) => [String(f.size), f.path]),
            ),
          );
          if (listed.truncated) ctx.io.stderr.write(`(more files than listed: name a folder, or raise --limit)\n`);
        }
        return ExitCode.ok;
      }
      case "read": {
        const [id, path] = idAndPath();
        await using s = await ctx.session("boxcar-session");
        ctx.io.stdout.write(await s.client.readSessionFile(id, path as string));
        return ExitCode.ok;
      }
      case "write": {
        const [id, path] = idAndPath();
        const data = await readInput(ctx.io, ctx.values.file as string, MAX_SESSION_FILE_BYTES, "--file");
        await using s = await ctx.session("boxcar-session");
        const wrote = await s.client.writeSessionFile(id, path as string, data, { executable: ctx.values.executable as boolean });
        ctx.print(ctx.values.json ? json(wrote) : `wrote ${wrote.size} bytes to ${wrote.path}`);
        return ExitCode.ok;
      }
      case "rm": {
        const [id, path] = idAndPath();
        await using s = await ctx.session("boxcar-session");
        const removed = await s.client.removeSessionFile(id, path as string);
        ctx.print(removed ? `removed ${path}` : `no ${path} to remove`);
        return removed ? ExitCode.ok : ExitCode.refused;
      }
      case "close": {
        await using s = await ctx.session("boxcar-session");
        const closed = await s.client.closeSession(one("ID"));
        ctx.print(ctx.values.json ? json(closed) : `session ${closed.id} ${closed.state}`);
        return ExitCode.ok;
      }
      case "get": {
        await using s = await ctx.session("boxcar-session");
        ctx.print(json(await s.client.getSession(one("ID"))));
        return ExitCode.ok;
      }
      case "events": {
        await using s = await ctx.session("boxcar-session");
        const follow = { follow: ctx.values.follow as boolean, signal: ctx.io.signal };
        // One line an event as it comes (JSON: one object a line), as `boxcar events` prints a job's.
        for await (const event of s.client.sessionEvents(one("ID"), follow))
          ctx.print(ctx.values.json ? JSON.stringify(event) : describeEvent(event));
        return ExitCode.ok;
      }
      case "logs": {
        await using s = await ctx.session("boxcar-session");
        const follow = { follow: ctx.values.follow as boolean, signal: ctx.io.signal };
        for await (const chunk of s.client.sessionLogs(one("ID"), follow)) {
          (chunk.stream === "stderr" ? ctx.io.stderr : ctx.io.stdout).write(chunk.data);
        }
        return ExitCode.ok;
      }
      default:
        throw new UsageError(`${verb ? `unknown session command ${verb}` : "missing session command"}\n\nusage: ${usage}`);
    }
  },
};

/** The code `session shell` exits with when the shell's connection ended before it said how it exited (as ssh's). */
const SHELL_LOST = 255;

/**
 * `boxcar session shell`: this terminal, in raw mode, on a shell in the session. Keys go as they
 * are typed (Ctrl-C and Ctrl-D among them), the window's size at start and at each SIGWINCH, and
 * the shell's exit code is this command's.
 */
async function runShell(ctx: Parameters<Command["run"]>[0], id: string, argv: string[] | undefined): Promise<number> {
  const stdin = ctx.io.stdin as (NodeJS.ReadableStream & { isTTY?: boolean; setRawMode?: (raw: boolean) => void }) | undefined;
  if (!stdin) throw new UsageError("session shell reads this terminal's keys, and this command has no stdin");
  const stdout = ctx.io.stdout as NodeJS.WritableStream & { isTTY?: boolean; columns?: number; rows?: number };
  const size = () => ({ cols: stdout.columns || 80, rows: stdout.rows || 24 });
  const timeout = optionalDuration(ctx.values.timeout, "--timeout");
  const term = ctx.io.env.TERM;
  await using s = await ctx.session("boxcar-session");
  const shell = await s.client.openShell(id, {
    ...size(),
    ...(argv ? { argv } : {}),
    env: envPairs(ctx.values.env as string[]),
    ...(ctx.values.cwd !== undefined ? { cwd: ctx.values.cwd as string } : {}),
    ...(term && /^[A-Za-z0-9._+-]{1,64}$/.test(term) ? { term } : {}),
    ...(timeout !== undefined ? { timeout } : {}),
  });
  const { stream } = shell;
  const raw = stdin.isTTY === true && typeof stdin.setRawMode === "function";
  if (raw) stdin.setRawMode?.(true);
  const onKeys = (chunk: Buffer | string) => {
    if (stream.destroyed || stream.writableEnded) return;
    if (!stream.write(chunk)) {
      stdin.pause();
      stream.once("drain", () => stdin.resume());
    }
  };
  const onResize = () => shell.resize(size().cols, size().rows);
  const hangUp = () => shell.close();
  stdin.on("data", onKeys);
  stdin.resume();
  (stdout as NodeJS.EventEmitter).on("resize", onResize);
  ctx.io.signal.addEventListener("abort", hangUp, { once: true });
  stream.pipe(stdout, { end: false });
  try {
    const exit = await shell.exited;
    return exitOf(exit);
  } catch (err) {
    if (ctx.io.signal.aborted) return SHELL_LOST;
    ctx.io.stderr.write(`${raw ? "\r\n" : ""}boxcar: the shell's connection ended: ${(err as Error).message}\n`);
    return SHELL_LOST;
  } finally {
    stdin.off("data", onKeys);
    stdin.pause();
    if (raw) stdin.setRawMode?.(false);
    (stdout as NodeJS.EventEmitter).off("resize", onResize);
    ctx.io.signal.removeEventListener("abort", hangUp);
    stream.unpipe(stdout as NodeJS.WritableStream);
  }
}

/** A TCP port given on the command line (`zero`: 0, any free one, too). */
function portOf(text: string | undefined, what: string, zero = false): number {
  const n = Number(text);
  if (zero && n === 0 && text?.trim() === "0") return 0;
  const parsed = Port.safeParse(text === undefined || text.trim() === "" ? Number.NaN : n);
  if (!parsed.success)
    throw new UsageError(
      `${what}: a port is a whole number from 1 to 65535${zero ? " (0: any free one)" : ""}, got ${JSON.stringify(text)}`,
    );
  return parsed.data;
}

/** `ID:PATH`, a path in session ID (`ID:` alone: its workspace); undefined for a local path. */
function inSession(arg: string): { id: string; path: string } | undefined {
  const found = /^(ses-[A-Za-z0-9_-]{1,60}):(.*)$/.exec(arg);
  return found ? { id: found[1] as string, path: found[2] || "." } : undefined;
}

/** The repository `--git` names, with `--ref` and `--depth`; undefined without `--git`. */
function gitSeed(values: { git?: string; ref?: string; depth?: string }): { url: string; ref?: string; depth?: number } | undefined {
  if (values.git === undefined) {
    if (values.ref !== undefined || values.depth !== undefined) throw new UsageError("--ref and --depth go with --git URL");
    return undefined;
  }
  const depth = values.depth === undefined ? undefined : Number(values.depth);
  if (depth !== undefined && !(Number.isInteger(depth) && depth >= 1))
    throw new UsageError(`--depth takes a whole number of commits, got ${values.depth}`);
  return { url: values.git, ...(values.ref !== undefined ? { ref: values.ref } : {}), ...(depth !== undefined ? { depth } : {}) };
}

/** A file's bytes (`-`: this process's stdin), at most `max` of them. */
async function readInput(io: { stdin?: NodeJS.ReadableStream }, source: string, max: number, flag: string): Promise<Buffer> {
  const stream = source === "-" ? io.stdin : createReadStream(source);
  if (!stream) throw new UsageError(`${flag} -: this command has no stdin to read`);
  const chunks: Buffer[] = [];
  let size = 0;
  try {
    for await (const chunk of stream) {
      const bytes = typeof chunk === "string" ? Buffer.from(chunk) : (chunk as Buffer);
      size += bytes.length;
      if (size > max) throw new UsageError(`${flag}: more than ${max} bytes (a session takes at most that in one request)`);
      chunks.push(bytes);
    }
  } catch (err) {
    if (err instanceof UsageError) throw err;
    throw new UsageError(`${flag} ${source}: ${(err as Error).message}`);
  }
  return Buffer.concat(chunks);
}

export const sessions: Command = {
  usage: "boxcar sessions [--state open|closed|lost]",
  maxArgs: 0,
  options: { state: { type: "string" } },
  async run(ctx) {
    const state = ctx.values.state === undefined ? undefined : SessionState.safeParse(ctx.values.state);
    if (state && !state.success) throw new UsageError(`--state must be open, closed or lost, got ${String(ctx.values.state)}`);
    await using s = await ctx.session("boxcar-sessions");
    const list = await s.client.listSessions(state?.data ? { state: state.data } : {});
    if (ctx.values.json) {
      ctx.print(json(list));
      return ExitCode.ok;
    }
    ctx.print(
      table(
        ["SESSION", "STATE", "OWNER", "AGENT", "WORKER", "COMMANDS", "LAST USED"],
        list.map((x) => [
          x.id,
          x.reason && x.state !== "open" ? `${x.state} (${x.reason})` : x.state === "open" && x.pausedAt ? "open (paused)" : x.state,
          x.owner,
          x.agent,
          x.workerId,
          String(x.execs),
          x.lastUsedAt,
        ]),
      ),
    );
    return ExitCode.ok;
  },
};

export const snapshots: Command = {
  usage: "boxcar snapshots | snapshots rm SNAPSHOT",
  maxArgs: 2,
  options: {},
  async run(ctx) {
    const [verb, id] = ctx.positionals;
    await using s = await ctx.session("boxcar-snapshots");
    if (verb === "rm") {
      if (!id) throw new UsageError("snapshots rm needs a SNAPSHOT id\n\nusage: boxcar snapshots | snapshots rm SNAPSHOT");
      const removed = await s.client.removeSnapshot(id);
      ctx.print(ctx.values.json ? json(removed) : `removed ${removed.id}`);
      return ExitCode.ok;
    }
    if (verb !== undefined) throw new UsageError(`unknown snapshots command ${verb}\n\nusage: boxcar snapshots | snapshots rm SNAPSHOT`);
    const list = await s.client.listSnapshots();
    ctx.print(
      ctx.values.json
        ? json(list)
        : table(
            ["SNAPSHOT", "OWNER", "AGENT", "SESSION", "SIZE", "TAKEN"],
            list.map((x) => [x.id, x.owner, x.agent, x.session, String(x.size), x.createdAt]),
          ),
    );
    return ExitCode.ok;
  },
};

/** `--env NAME=VALUE`, each. */
function envPairs(pairs: readonly string[]): Record<string, string> {
  const env: Record<string, string> = {};
  for (const pair of pairs) {
    const at = pair.indexOf("=");
    if (at < 1) throw new UsageError(`--env takes NAME=VALUE, got ${JSON.stringify(pair)}`);
    env[pair.slice(0, at)] = pair.slice(at + 1);
  }
  return env;
}

/** As `docker exec` and `ssh` do: the command's own exit code (128 + n for a signal). */
function exitOf(ran: { exitCode: number | null; signal: string | null }): number {
  return ran.exitCode ?? 128 + ((ran.signal && constants.signals[ran.signal as NodeJS.Signals]) || constants.signals.SIGKILL);
}
