import type { Logger } from "@boxcar/common";
import type { Topology } from "@boxcar/fabric";
import { DUPLICATE_WINDOW_MS, getJson, storedMessages } from "@boxcar/fabric/internal";
import { JobRecord } from "@boxcar/protocol";
import type { AdmissionContext } from "../intake/admission.js";
import type { JobIndex } from "../jobs/job-index.js";
import { publishWorkItem } from "../jobs/work-items.js";
import { Sweep } from "../loops/sweep.js";

/** How long one look at the work stream's size answers `workMissing`. */
const CHECK_REUSE_MS = 500;

/**
 * Finds, however long ago it happened, a job recorded `queued` whose work item is not in the
 * work stream (a dispatcher died between the two, with no dispatcher running for longer than the
 * duplicate window the admission sweep relies on), and enqueues it again.
 *
 * Each look costs one stream info while all is well: every job waiting or running has a work
 * item, so the stream holds at least as many items as the index counts such jobs. Only when it
 * holds fewer does it read the items (their job ids, one request each) to learn which jobs have
 * none. A job younger than the duplicate window is the admission sweep's; a job whose record
 * moved on meanwhile is left alone. A second copy of an item is to be avoided: taken while the
 * first runs, it would start another attempt (a claim takes over a running job, as after a
 * crash), and the first would be fenced off only once it next writes.
 */
export class RecoverySweep {
  private readonly looks: Sweep<number>;
  private lastCheck: { at: number; missing: Promise<boolean> } | undefined;

  constructor(
    private readonly topology: Topology,
    private readonly index: JobIndex,
    private readonly log: Logger,
    intervalMs: number,
    private readonly ctx: Pick<AdmissionContext, "agents" | "signer" | "workers" | "limits">,
  ) {
    this.looks = new Sweep({
      pass: (signal) => this.recover(signal),
      intervalMs,
      onError: (err) => log.warn({ err }, "could not look for jobs without work"),
    });
  }

  start(): void {
    this.looks.start();
  }

  /** Looks now; resolves with how many jobs it enqueued again. */
  run(): Promise<number> {
    return this.looks.run();
  }

  stop(): Promise<void> {
    return this.looks.stop();
  }

  /**
   * Whether some job queued or running may lack its work item: the work stream holds fewer items
   * than the index counts such jobs. An admission under way (record written, item not yet) counts
   * too, for a moment. One stream info, shared by the calls of the next half second.
   */
  workMissing(): Promise<boolean> {
    const now = Date.now();
    if (!this.lastCheck || now - this.lastCheck.at > CHECK_REUSE_MS) {
      const waiting = this.index.count("queued") + this.index.count("running");
      this.lastCheck = {
        at: now,
        missing: this.topology.jsm.streams.info(this.topology.names.streams.work).then(({ state }) => state.messages < waiting),
      };
      this.lastCheck.missing.catch(() => {
        this.lastCheck = undefined;
      });
    }
    return this.lastCheck.missing;
  }

  private async recover(signal: AbortSignal): Promise<number> {
    const { topology, index } = this;
    const { names } = topology;
    if (!(await this.workMissing())) return 0;
    const { state } = await topology.jsm.streams.info(names.streams.work);

    const withWork = new Set<string>();
    // To the stream's end, not just `last_seq`: an item stored since (a given-up item put back,
    // say) counts as work too.
    for await (const item of storedMessages(topology.jsm, names.streams.work, names.subjects.workAll, { from: state.first_seq })) {
      if (signal.aborted) break;
      // Every item carries its job's id as its message id (`<job>` or `<job>:retry:<n>`, ...).
      const id = item.header?.get("Nats-Msg-Id")?.split(":")[0];
      if (id) withWork.add(id);
    }
    let recovered = 0;
    for (const [id] of index.newestFirst(undefined, { state: "queued" })) {
      if (signal.aborted) break;
      if (withWork.has(id)) continue;
      const job = (await getJson(topology.jobs, id, JobRecord, "job record"))?.value;
      if (job?.state !== "queued" || Date.now() - Date.parse(job.queuedAt ?? job.createdAt) < DUPLICATE_WINDOW_MS) continue;
      await publishWorkItem(topology, job, await this.ctx.agents.get(job.agent), this.ctx, `${id}:recovered:${state.last_seq}`);
      recovered += 1;
      this.log.warn({ jobId: id, queuedAt: job.queuedAt ?? job.createdAt }, "a queued job had no work item; enqueued it again");
    }
    return recovered;
  }
}
