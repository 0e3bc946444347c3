/**
 * A session's watches (docs/sessions.md#watch): `sessions.watch` starts one on a path of the
 * workspace, and each change there is a `file_changed` event on the session's event subject, until
 * `sessions.unwatch`, its timeout, or the session's end. The watching is done by the session's
 * helper (helper/session-helper.cjs, `watch`): inside a Docker session's container, as its file
 * operations are, or run alone in a host session's workspace. It walks the path and takes an
 * inotify watch on each folder (and on each one made after), so a change is seen at once and costs
 * nothing while nothing changes; a poll would stat every file each time round.
 *
 * What a watch says is the session's own word (a command can tamper with the helper): its lines
 * are bounded, their paths checked to be workspace-relative, and at most `RATE` events a second
 * are published; past that one `overflow` a second says some went unsaid. A watch does not keep
 * the session from going idle.
 */

import { BoxcarError, ErrorCode, parseWith, type SessionEvent, type WatchInfo, WatchRef, WatchRequest } from "@boxcar/protocol";
import { MAX_SESSION_WATCHES } from "@boxcar/protocol/internal";
import type { SessionSandbox } from "../sandbox/sandbox.js";
import { workspaceCwd } from "../workspace/workspace-path.js";
import { runHelperVerb } from "./helper-verbs.js";

/** How long a watch has to walk its folders and say it is ready. */
const READY_TIMEOUT_MS = 30_000;
/** Events a second a watch publishes at most (and a burst of twice that); more are counted, and said in one `overflow`. */
const RATE = 100;

type Change = NonNullable<SessionEvent["change"]>;
const CHANGES: ReadonlySet<string> = new Set<Change>(["created", "modified", "removed", "overflow"]);

/** What a watch says: a change (`path`, `change`). */
export type FileChange = { watchId: string; path: string; change: Change };

interface Watch {
  info: WatchInfo;
  stop: AbortController;
  timer: NodeJS.Timeout;
  tokens: number;
  refilledAt: number;
  /** Changes not published (past the rate) since the last overflow said so. */
  dropped: number;
  overflowTimer?: NodeJS.Timeout;
  ended: Promise<unknown>;
}

/** A session as its watches see it. */
interface WatchedSession {
  readonly sandbox: SessionSandbox;
  readonly watches: SessionWatches;
}

/** The watch requests, by the last token of their subject. */
export function watchRequests(holding: (id: string) => WatchedSession): Record<string, (body: unknown) => Promise<unknown>> {
  return {
    watch: async (body) => {
      const { id, path, timeout } = parseWith(WatchRequest, body, "request");
      const held = holding(id);
      return { watch: await held.watches.start(held.sandbox, id, path, timeout) };
    },
    unwatch: async (body) => {
      const { id, watchId } = parseWith(WatchRef, body, "request");
      return { watch: holding(id).watches.stop(watchId) };
    },
  };
}

export class SessionWatches {
  private readonly byId = new Map<string, Watch>();
  private count = 0;

  /** `changed`: publishes one change as the session's `file_changed` event. */
  constructor(private readonly changed: (change: FileChange) => Promise<void>) {}

  /** Starts watching `path` (default: the workspace) for `timeoutMs`; answers once its folders are watched. */
  async start(sandbox: SessionSandbox, sessionId: string, path: string | undefined, timeoutMs: number): Promise<WatchInfo> {
    // Refused before anything runs: a path out of the workspace.
    const folder = path === undefined ? undefined : workspaceCwd(path);
    if (this.byId.size >= MAX_SESSION_WATCHES) {
      throw new BoxcarError(
        ErrorCode.conflict,
        `session ${sessionId} has ${MAX_SESSION_WATCHES} watches already, the most it may: unwatch one (${[...this.byId.keys()].join(", ")})`,
      );
    }
    this.count += 1;
    const watchId = `${sessionId}.w${this.count}`;
    const now = Date.now();
    const stop = new AbortController();
    const watch: Watch = {
      info: {
        watchId,
        path: folder ?? ".",
        startedAt: new Date(now).toISOString(),
        endsAt: new Date(now + timeoutMs).toISOString(),
        folders: 0,
        active: true,
      },
      stop,
      timer: setTimeout(() => this.stop(watchId), timeoutMs),
      tokens: RATE * 2,
      refilledAt: now,
      dropped: 0,
      ended: Promise.resolve(),
    };
    this.byId.set(watchId, watch);
    let complaint = "";
    let readyNow: (folders: number) => void = () => {};
    const ready = new Promise<number>((resolve, reject) => {
      readyNow = resolve;
      const readyTimer = setTimeout(
        () =>
          reject(
            new BoxcarError(ErrorCode.unavailable, `the watch of ${watch.info.path} was not ready within ${READY_TIMEOUT_MS / 1000} s`),
          ),
        READY_TIMEOUT_MS,
      );
      watch.ended = Promise.resolve()
        .then(() =>
          runHelperVerb(sandbox, ["watch", folder ?? ""], {
            signal: stop.signal,
            onLine: (line) => this.line(watch, line, readyNow),
            onComplaint: (text) => {
              complaint = text;
            },
          }),
        )
        .then((result) => {
          // Ended before it was ready: why, as the helper said.
          if (result.exitCode === 2)
            reject(new BoxcarError(ErrorCode.notFound, `no file or folder ${watch.info.path} in session ${sessionId}`));
          else
            reject(
              new BoxcarError(
                ErrorCode.invalid,
                `cannot watch ${watch.info.path}: ${complaint || `the watch ended (${result.exitCode ?? result.signal})`}`,
              ),
            );
        }, reject)
        .finally(() => {
          clearTimeout(readyTimer);
          // Ended by itself (its session's container went, say): no longer watching.
          this.end(watch);
        });
    });
    try {
      watch.info = { ...watch.info, folders: await ready };
    } catch (err) {
      this.end(watch);
      throw err;
    }
    return watch.info;
  }

  /** Stops a watch: no more events from it. */
  stop(watchId: string): WatchInfo {
    const watch = this.byId.get(watchId);
    if (!watch) throw new BoxcarError(ErrorCode.notFound, `no watch ${watchId} in this session (it ended, or never was)`);
    this.end(watch);
    return watch.info;
  }

  /** Stops every watch (the session closes) and waits for them to end. */
  async stopAll(): Promise<void> {
    const watches = [...this.byId.values()];
    for (const watch of watches) this.end(watch);
    await Promise.allSettled(watches.map((w) => w.ended));
  }

  private end(watch: Watch): void {
    clearTimeout(watch.timer);
    watch.stop.abort();
    watch.info = { ...watch.info, active: false };
    if (this.byId.get(watch.info.watchId) === watch) this.byId.delete(watch.info.watchId);
    if (watch.overflowTimer) {
      clearTimeout(watch.overflowTimer);
      watch.overflowTimer = undefined;
      this.sayOverflow(watch);
    }
  }

  /** A line of the helper's: its readiness, or a change (checked: the session's own word). */
  private line(watch: Watch, line: string, ready: (folders: number) => void): void {
    let said: { ready?: unknown; folders?: unknown; path?: unknown; change?: unknown };
    try {
      said = JSON.parse(line) as typeof said;
    } catch {
      return;
    }
    if (said?.ready === true) {
      ready(Number.isSafeInteger(said.folders) ? (said.folders as number) : 0);
      return;
    }
    if (!watch.info.active || typeof said?.change !== "string" || !CHANGES.has(said.change) || !workspaceRelative(said.path)) return;
    this.publish(watch, said.path, said.change as Change);
  }

  /** Publishes a change within the watch's rate; past it, counts it for one `overflow` a second. */
  private publish(watch: Watch, path: string, change: Change): void {
    const now = Date.now();
    watch.tokens = Math.min(RATE * 2, watch.tokens + ((now - watch.refilledAt) * RATE) / 1000);
    watch.refilledAt = now;
    if (watch.tokens < 1) {
      watch.dropped += 1;
      watch.overflowTimer ??= setTimeout(() => {
        watch.overflowTimer = undefined;
        this.sayOverflow(watch);
      }, 1_000);
      return;
    }
    watch.tokens -= 1;
    void this.changed({ watchId: watch.info.watchId, path, change });
  }

  private sayOverflow(watch: Watch): void {
    if (watch.dropped === 0) return;
    watch.dropped = 0;
    void this.changed({ watchId: watch.info.watchId, path: watch.info.path, change: "overflow" });
  }
}

/** A path as a watch may say one: relative to the workspace, with no `..`, bounded. */
function workspaceRelative(path: unknown): path is string {
  return (
    typeof path === "string" &&
    path.length > 0 &&
    path.length <= 4096 &&
    !path.startsWith("/") &&
    !path.includes("\0") &&
    !path.split("/").includes("..")
  );
}
