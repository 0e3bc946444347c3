/**
 * One attempt alive (docs/reliability.md#one-attempt-alive): an agent never outlives its worker's
 * hold on the job.
 *
 * The worker holds each attempt by a lease: JetStream offers the job to another worker once the
 * pool's ack wait (`leaseMs`) passes without a renewal. The worker renews at a third of it, and
 * counts a renewal as confirmed when a read of the job's record right after comes back: NATS was
 * reachable. An {@link AttemptLease} keeps the last confirmed renewal, and says the attempt must
 * stop once none came for `leaseMs - marginMs` (the margin a sixth of the lease): its stop time.
 *
 * The agent runs under a lifeline: a sentinel in the agent's process group reads a pipe from the
 * worker (fd 3 on the host; the container's attached stdin in Docker). At each confirmed renewal
 * the worker writes a beat on it: the seconds left until the stop time. When the pipe ends (the
 * worker died, however: the kernel closes its end) or no beat comes before the last one's time is
 * up (the worker is frozen, or cut off from NATS), the sentinel SIGKILLs the agent's process
 * group, itself with it. So the agent is gone by the stop time, a margin before JetStream can hand
 * the job to another attempt, whatever becomes of the worker.
 */

/**
 * The shell script that runs an agent under a lifeline: `sh -c SCRIPT boxcar-agent WAIT_S ARGV...`
 * (`WAIT_S`: the seconds left until the stop time; empty: none). `lifeline`: the pipe is fd 3 (the
 * host: the agent's stdin stays its own) or stdin (a container's attached stdin, moved to fd 3:
 * the agent gets an empty one). Then the shell becomes the agent (`exec`), so the agent's pid,
 * exit code and signals are the process's own.
 */
export function lifelineScript(lifeline: "fd3" | "stdin"): string {
  return ["boxcar_stop_s=$1; shift", ...(lifeline === "stdin" ? [LIFELINE_FROM_STDIN] : []), SENTINEL, 'exec "$@" 3<&-'].join("\n");
}

/** Moves a container's attached stdin, the lifeline, to fd 3 (where {@link SENTINEL} reads it); stdin is then empty. */
export const LIFELINE_FROM_STDIN = "exec 3<&0 </dev/null";

/**
 * The sentinel's wait for beats with a shell's own `read -t` (bash, busybox's ash): it makes no
 * process, so an agent that holds every process its pids limit allows cannot stop it. Each beat
 * must come before the time the one before gave. (The probe before it asks for tenths: a busybox
 * built without them refuses `-t 0.5`, and the sentinel takes the next way.)
 */
const READ_BEATS = `boxcar_wait=$boxcar_stop_s; while read -r -t "$boxcar_wait" boxcar_beat && [ -n "$boxcar_beat" ]; do boxcar_wait=$boxcar_beat; done`;

/**
 * The signals the sentinel ignores: every one whose default would end or stop it, save KILL and
 * STOP, which cannot be, and 32 and 33, which the C library keeps for itself (an agent may signal
 * its own group: `kill -USR1 0` must not end the lifeline with the default action, which runs no
 * EXIT trap).
 */
const IGNORED_SIGNALS = [
  ...[1, 2, 3, 4, 5, 6, 7, 8, 10, 11, 12, 13, 14, 15, 16, 20, 21, 22, 24, 25, 26, 27, 29, 30, 31],
  ...Array.from({ length: 31 }, (_, i) => 34 + i), // the real-time signals
].join(" ");

/** Where the sentinel looks for its tools after the agent's own `PATH`: a `PATH` that leaves them out does not take the stop time away. */
const TOOL_DIRS = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/**
 * The shell line that starts the sentinel on the lifeline at fd 3, the seconds it first waits in
 * `$boxcar_stop_s` (empty: no stop time). How it waits for each beat, the first that the image has:
 * - the shell's own `read -t` taking tenths of a second (bash, or busybox's ash, as `sh`), in
 *   place: no process per beat;
 * - bash, where `sh` is another shell (Debian's dash): the same loop in `bash --norc -p`, which
 *   takes no functions, startup file or options from the environment (`--norc`: Debian's bash
 *   reads `~/.bashrc`, the agent's workspace's, when its stdin is a socket, as the host's
 *   lifeline is), run as a child, so that the EXIT trap kills the group however it ends (a `bash`
 *   that is not bash included);
 * - `timeout` and `head` (coreutils or busybox), which fork for each beat (`timeout -s KILL`: the
 *   sentinel ignores SIGTERM, and `head` would inherit that). A fork refused (an agent at its pids
 *   limit) ends the sentinel, and its EXIT trap kills the group: the agent is stopped early;
 * - none: only the pipe's end counts (`read` with no time limit).
 * It looks for `bash`, `timeout` and `head` on the agent's `PATH`, then in `TOOL_DIRS`. Then it SIGKILLs its process group, the agent's. Job control is turned off first (`set +m`: a
 * `SHELLOPTS=monitor` would give the sentinel a group of its own). It is forked twice (so it is no
 * child of the agent's, which may wait for any child), keeps the pipe to itself (the agent's
 * commands are run with `3<&-`), and ignores the signals an agent or a stop may send the group
 * (so the lifeline holds through a stop's grace period). Its stdin is named outright: a
 * background command's would otherwise be /dev/null. Whatever else ends it (an error, a fork
 * refused), its EXIT trap kills the group. What it cannot withstand is an agent that means to
 * end it: a SIGKILL, or beats written into its pipe (docs/reliability.md, "What is not covered").
 */
export const SENTINEL = [
  `set +m; ( ( trap '' ${IGNORED_SIGNALS}; trap 'kill -KILL 0' EXIT; unset IFS POSIXLY_CORRECT TMOUT; PATH="\${PATH:+$PATH:}${TOOL_DIRS}";`,
  `if [ -n "$boxcar_stop_s" ] && { read -r -t 0.5 boxcar_beat </dev/null; [ "$?" -eq 1 ]; } 2>/dev/null; then ${READ_BEATS};`,
  `elif [ -n "$boxcar_stop_s" ] && command -v bash >/dev/null 2>&1; then bash --norc -p -c 'boxcar_stop_s=$1; ${READ_BEATS}; kill -KILL 0' boxcar-sentinel "$boxcar_stop_s";`,
  'elif [ -n "$boxcar_stop_s" ] && command -v timeout >/dev/null 2>&1 && command -v head >/dev/null 2>&1; then boxcar_wait=$boxcar_stop_s; while boxcar_beat=$(timeout -s KILL "$boxcar_wait" head -n 1) && [ -n "$boxcar_beat" ]; do boxcar_wait=$boxcar_beat; done;',
  "else while read -r boxcar_beat; do :; done; fi;",
  "kill -KILL 0 ) <&3 3<&- >/dev/null 2>&1 & )",
].join(" ");

/**
 * Seconds as the sentinel's `timeout` takes them: to a tenth, cut down, at least one (busybox
 * drops the tenths, so it may stop up to a second sooner; below a second `timeout` would read 0 as
 * no limit). None: "".
 */
export function stopSeconds(ms: number | undefined): string {
  return ms === undefined ? "" : String(Math.max(1, Math.floor(ms / 100) / 10));
}

/** The argv that runs `argv` under a lifeline whose first beat must come within `waitMs` (none: only the pipe's end counts). */
export function underLifeline(argv: readonly string[], lifeline: "fd3" | "stdin", waitMs: number | undefined): string[] {
  return ["/bin/sh", "-c", lifelineScript(lifeline), "boxcar-agent", stopSeconds(waitMs), ...argv];
}

/** How much sooner than its stop time a sentinel may have killed an agent: `stopSeconds` cuts to whole seconds on busybox. */
export const SENTINEL_EARLY_MS = 1_000;

/**
 * An attempt's hold on its job, as its worker knows it: renewed at each confirmed keep-alive, and
 * to be let go (its agent stopped) once none came for `stopAfterMs`. Its times are the worker's
 * monotonic clock (`performance.now()`), so a step of the wall clock moves nothing.
 */
export class AttemptLease {
  /** How long after the last confirmed renewal the attempt's agent must be stopped. */
  readonly stopAfterMs: number;
  private confirmedAt: number;
  private ended = false;
  private readonly beats = new Set<(msLeft: number) => void>();

  constructor(
    /** The pool's ack wait: JetStream offers the job again this long after the last renewal it received. */
    readonly leaseMs: number,
    now = performance.now(),
  ) {
    this.stopAfterMs = leaseMs - lapseMarginMs(leaseMs);
    this.confirmedAt = now;
  }

  /**
   * A renewal sent at `sentAt` was confirmed (at `now`): the lease holds until `sentAt +
   * stopAfterMs`, and each lifeline hears how long that is from now. Once lapsed, it stays
   * lapsed: a renewal confirmed too late (a thawed worker's) counts for nothing.
   */
  renewed(sentAt: number, now = performance.now()): void {
    if (this.lapsed(now) || sentAt <= this.confirmedAt) return;
    this.confirmedAt = sentAt;
    const left = this.msLeft(now);
    for (const beat of this.beats) beat(left);
  }

  /** When the attempt must have stopped, unless renewed before (`performance.now()` time). */
  get stopAt(): number {
    return this.confirmedAt + this.stopAfterMs;
  }

  /** How long until the stop time. */
  msLeft(now = performance.now()): number {
    return this.stopAt - now;
  }

  /** Whether the lease lapsed: the attempt must stop and write nothing. Once true, always true. */
  lapsed(now = performance.now()): boolean {
    if (!this.ended && now >= this.stopAt) this.ended = true;
    return this.ended;
  }

  /** Calls `beat` with the time left at each confirmed renewal, until the returned function is called. */
  onRenewed(beat: (msLeft: number) => void): () => void {
    this.beats.add(beat);
    return () => this.beats.delete(beat);
  }
}

/** What a lifeline beat says: the seconds left until the stop time, as the sentinel's `timeout` reads them. */
export const beatLine = (msLeft: number): string => `${stopSeconds(msLeft)}\n`;

/** How long before the lease runs out an unconfirmed attempt stops: a sixth of the lease (5 s of the default 30 s). */
function lapseMarginMs(leaseMs: number): number {
  return Math.ceil(leaseMs / 6);
}
