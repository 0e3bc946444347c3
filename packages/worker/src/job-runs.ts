import type { Logger } from "@boxcar/common";
import { BoxcarError, ErrorCode, type ErrorInfo, toErrorInfo, WORK_ITEM_VERSION, WorkItem } from "@boxcar/protocol";
import { decodeMessage } from "@boxcar/protocol/internal";
import type { Slots } from "./intake/slots.js";
import type { WorkDelivery } from "./intake/work-delivery.js";
import type { StopReason } from "./run/attempt-outcome.js";
import { JobRun, type JobRunContext } from "./run/job-run.js";
import type { ResolvedWorkerOptions } from "./worker-options.js";

/** How long a work item from a newer release waits before it is offered again. */
const NEWER_RELEASE_DELAY_MS = 5_000;

/**
 * Why a work item this release cannot read is a newer release's (see docs/deploy.md#upgrades),
 * not a malformed one: a later protocol version, or fields it does not know. Undefined when it
 * is neither.
 */
function newerRelease(data: Uint8Array): string | undefined {
  let json: unknown;
  try {
    json = JSON.parse(new TextDecoder().decode(data));
  } catch {
    return undefined;
  }
  const version = (json as { v?: unknown } | null)?.v;
  if (typeof version === "number" && version > WORK_ITEM_VERSION) {
    return `a work item of version ${version}; this worker reads versions up to ${WORK_ITEM_VERSION}`;
  }
  const parsed = WorkItem.safeParse(json);
  if (parsed.success || !parsed.error.issues.every((issue) => issue.code === "unrecognized_keys")) return undefined;
  return "a work item from a newer release (fields this worker does not know)";
}

/** What the runs need of their worker. */
export interface JobRunsContext {
  options: ResolvedWorkerOptions;
  log: Logger;
  slots: Slots;
  /** Aborted when pulling stops: an item delivered after is handed back at once. */
  pulling: AbortSignal;
  /** What each run is given, as the worker has it when the item comes (its leases, sessions and gateway are known once it started). */
  runContext(): JobRunContext;
  /** Tells of a work item that can never run (a `work_rejected` worker event). */
  rejected(error: ErrorInfo): void;
}

/**
 * The jobs a worker runs, by id: each delivered work item checked (its signature, when the
 * worker checks them) and decoded, then handled by a `JobRun` that holds one of the worker's
 * slots until it is done (a job in a session holds none). An item that can never run is
 * terminated, a newer release's handed back.
 */
export class JobRuns {
  /** The jobs it runs, by id, with the promise that settles when each is handled; `slotted`: one of its slots. */
  private readonly runs = new Map<string, { run: JobRun; done: Promise<void>; slotted: boolean }>();

  constructor(private readonly ctx: JobRunsContext) {}

  get size(): number {
    return this.runs.size;
  }

  has(jobId: string): boolean {
    return this.runs.has(jobId);
  }

  /** The run of a job, if this worker runs it. */
  get(jobId: string): JobRun | undefined {
    return this.runs.get(jobId)?.run;
  }

  ids(): string[] {
    return [...this.runs.keys()];
  }

  /** How many of the worker's slots its jobs hold (a job in a session uses its session's). */
  slotted(): number {
    let jobs = 0;
    for (const { slotted } of this.runs.values()) if (slotted) jobs += 1;
    return jobs;
  }

  /** Settles once every job in hand now is handled. */
  finished(): Promise<unknown> {
    return Promise.all([...this.runs.values()].map((r) => r.done));
  }

  /** Stops every job in hand (`worker_stopped`: each goes back to the queue). */
  stopAll(reason: StopReason): void {
    for (const { run } of this.runs.values()) run.stop(reason);
  }

  /** Starts one delivered work item; it holds one slot until it is handled (`slotted`: a pool's; a session's job holds none). */
  dispatch(msg: WorkDelivery, slotted = true): void {
    const { log } = this.ctx;
    const release = () => {
      if (slotted) this.ctx.slots.release(1);
    };
    if (this.ctx.pulling.aborted) {
      msg.nak();
      release();
      return;
    }
    let item: WorkItem;
    try {
      const unsigned = this.ctx.options.verifier?.problem(msg.subject, msg.data, msg.headers);
      if (unsigned) throw new BoxcarError(ErrorCode.invalid, `${unsigned}; it was not run`);
      item = decodeMessage(WorkItem, msg.data, "work item");
    } catch (err) {
      const newer = newerRelease(msg.data);
      if (newer) {
        // Mid-upgrade, a newer dispatcher's item: hand it back for a newer worker. Its job stays
        // queued until one comes or its queue timeout.
        log.warn({ seq: msg.seq, err: (err as Error).message }, `${newer}; handing it back`);
        msg.nak(NEWER_RELEASE_DELAY_MS);
      } else {
        this.reject(msg, toErrorInfo(err));
      }
      release();
      return;
    }
    if (this.runs.has(item.jobId)) {
      // Redelivered while still running here: the run in progress acknowledges it.
      log.warn({ jobId: item.jobId }, "work item delivered again while its job runs here; ignoring the copy");
      release();
      return;
    }
    const run = new JobRun(this.ctx.runContext(), msg, item);
    const done = run.run().finally(() => {
      this.runs.delete(item.jobId);
      release();
    });
    this.runs.set(item.jobId, { run, done, slotted });
  }

  /** A work item that can never run: terminate it so it is not delivered again, and say why. */
  private reject(msg: WorkDelivery, error: ErrorInfo): void {
    msg.term(`${error.code}: ${error.message}`.slice(0, 1024));
    this.ctx.log.warn({ error, seq: msg.seq }, "rejected a work item");
    this.ctx.rejected(error);
  }
}
