/**
 * One attempt alive (docs/reliability.md#one-attempt-alive): an agent never outlives its worker's
 * hold on the job.
 *
 * The worker holds each attempt by a lease: JetStream offers the job to another worker once the
 * pool's ack wait (`leaseMs`) passes without a renewal. The worker renews at a third of it, and
 * counts a renewal as confirmed when a read of the job's record right after comes back: NATS was
 * reachable. An {@link AttemptLease} keeps the last confirmed renewal, and says the attempt must
 * stop once none came for `leaseMs - marginMs` (the margin a sixth of the lease).
 *
 * The agent runs under a lifeline: a sentinel in the agent's process group reads a pipe from the
 * worker (fd 3 on the host; the container's attached stdin in Docker). The worker writes a beat on
 * it at each confirmed renewal. When the pipe ends (the worker died, however: the kernel closes its
 * end) or no beat comes within the lease's stop time (the worker is frozen, or cut off from NATS),
 * the sentinel SIGKILLs the agent's process group, itself with it. So the agent is gone before
 * JetStream can hand the job to another attempt, whatever becomes of the worker.
 */

/** What the worker writes on a lifeline at each confirmed renewal. */
export const LIFELINE_BEAT = ".\n";

/**
 * The shell script that runs an agent under a lifeline: `sh -c SCRIPT boxcar-agent STOP_S ARGV...`.
 * `lifeline`: the pipe is fd 3 (the host: the agent's stdin stays its own) or stdin (a
 * container's attached stdin, moved to fd 3: the agent gets an empty one). Then the shell becomes
 * the agent (`exec`), so the agent's pid, exit code and signals are the process's own.
 */
export function lifelineScript(lifeline: "fd3" | "stdin"): string {
  return ["boxcar_stop_s=$1; shift", ...(lifeline === "stdin" ? [LIFELINE_FROM_STDIN] : []), SENTINEL, 'exec "$@" 3<&-'].join("\n");
}

/** Moves a container's attached stdin, the lifeline, to fd 3 (where {@link SENTINEL} reads it); stdin is then empty. */
export const LIFELINE_FROM_STDIN = "exec 3<&0 </dev/null";

/**
 * The shell line that starts the sentinel on the lifeline at fd 3, its stop time in
 * `$boxcar_stop_s` (empty: none). It reads beats: with `timeout` (coreutils or busybox) and a
 * stop time, one must come within it; without, only the pipe's end counts. Then it SIGKILLs its
 * process group, the agent's. It is forked twice (so it is no child of the agent's, which may
 * wait for any child), keeps the pipe to itself (the agent's commands are run with `3<&-`), and
 * shrugs off the SIGTERM a stop sends the group first (so the lifeline holds through the grace
 * period). Its stdin is named outright: a background command's would otherwise be /dev/null.
 */
export const SENTINEL = `( ( trap '' HUP INT TERM; if [ -n "$boxcar_stop_s" ] && command -v timeout >/dev/null 2>&1; then while boxcar_beat=$(timeout "$boxcar_stop_s" head -n 1) && [ -n "$boxcar_beat" ]; do :; done; else while read -r boxcar_beat; do :; done; fi; kill -KILL 0 ) <&3 3<&- >/dev/null 2>&1 & )`;

/** A lifeline's stop time as the sentinel's `timeout` takes it (seconds, to a tenth); none: "". */
export function stopSeconds(ms: number | undefined): string {
  return ms === undefined ? "" : String(Math.max(1, Math.floor(ms / 100) / 10));
}

/** The argv that runs `argv` under a lifeline whose beats must come within `beatWithinMs` (none: only the pipe's end counts). */
export function underLifeline(argv: readonly string[], lifeline: "fd3" | "stdin", beatWithinMs: number | undefined): string[] {
  return ["/bin/sh", "-c", lifelineScript(lifeline), "boxcar-agent", stopSeconds(beatWithinMs), ...argv];
}

/**
 * An attempt's hold on its job, as its worker knows it: renewed at each confirmed keep-alive, and
 * to be let go (its agent stopped) once none came for `stopAfterMs`.
 */
export class AttemptLease {
  /** How long after the last confirmed renewal the attempt's agent must be stopped. */
  readonly stopAfterMs: number;
  private confirmedAt: number;
  private readonly beats = new Set<() => void>();

  constructor(
    /** The pool's ack wait: JetStream offers the job again this long after the last renewal it received. */
    readonly leaseMs: number,
    now = Date.now(),
  ) {
    this.stopAfterMs = leaseMs - lapseMarginMs(leaseMs);
    this.confirmedAt = now;
  }

  /**
   * A renewal sent at `sentAt` was confirmed: the lease holds until `sentAt + stopAfterMs`. The
   * lifelines beat only for a confirmation that came quickly: a sentinel counts its stop time
   * from the beat, and a late one would stretch it past the lease.
   */
  renewed(sentAt: number, now = Date.now()): void {
    // Once lapsed, it stays lapsed: a thawed worker's renewal comes too late to count.
    if (sentAt <= this.confirmedAt || this.lapsed(sentAt)) return;
    this.confirmedAt = sentAt;
    if (now - sentAt > this.maxBeatDelayMs) return;
    for (const beat of this.beats) beat();
  }

  /** The longest after a renewal was sent that its beat goes out: half the margin. */
  private get maxBeatDelayMs(): number {
    return lapseMarginMs(this.leaseMs) / 2;
  }

  /**
   * How long a lifeline's sentinel waits for the next beat: the stop time less the most a beat
   * may come after its renewal, so the sentinel too has killed the agent by the stop time.
   */
  get beatWithinMs(): number {
    return this.stopAfterMs - this.maxBeatDelayMs;
  }

  /** When the attempt must have stopped, unless renewed before (ms since the epoch). */
  get stopAt(): number {
    return this.confirmedAt + this.stopAfterMs;
  }

  /** Whether the lease lapsed: the attempt must stop and write nothing. */
  lapsed(now = Date.now()): boolean {
    return now >= this.stopAt;
  }

  /** Calls `beat` at each confirmed renewal, until the returned function is called. */
  onRenewed(beat: () => void): () => void {
    this.beats.add(beat);
    return () => this.beats.delete(beat);
  }
}

/** How long before the lease runs out an unconfirmed attempt stops: a sixth of the lease (5 s of the default 30 s). */
export function lapseMarginMs(leaseMs: number): number {
  return Math.ceil(leaseMs / 6);
}
