import type { Logger } from "@boxcar/common";
import type { Topology } from "@boxcar/fabric";
import { isStorageFull, nowIso, publishEvent } from "@boxcar/fabric/internal";
import {
  type BoxcarEvent,
  type ErrorInfo,
  type HarnessStep,
  type JobEvent,
  type JobEventType,
  type JobState,
  PROTOCOL_VERSION,
  type SandboxEvent,
  type SandboxEventType,
  type SandboxInfo,
} from "@boxcar/protocol";
import type { SandboxBackend } from "../sandbox/sandbox.js";
import type { Redactor } from "../workspace/redactor.js";
import type { RoomWait } from "./room-wait.js";

/** The fields of an event that say what it is and whose: never redacted (see `JobEvents.redacted`). */
const IDENTITY = [
  "v",
  "at",
  "kind",
  "type",
  "jobId",
  "owner",
  "agent",
  "state",
  "attempt",
  "workerId",
  "run",
  "seq",
  "backend",
  "sandboxId",
];

/** Progress events waiting beyond this many are dropped: a chatty agent cannot flood the stream. */
const MAX_QUEUED_PROGRESS = 64;
/** Events held back beyond this many go out one by one at once: a folded event stays small. */
const MAX_HELD = 32;
/** The job events that end an attempt: the one an attempt's held events are folded into. */
const ATTEMPT_ENDS: ReadonlySet<JobEventType> = new Set([
  "succeeded",
  "failed",
  "timed_out",
  "cancelled",
  "expired",
  "retrying",
  "dead",
  "requeued",
]);

export interface SandboxRef {
  backend: SandboxBackend;
  sandboxId: string;
}

export interface JobEventDetails {
  sandbox?: SandboxInfo;
  message?: string;
  error?: ErrorInfo;
  /** A prompt agent's loop: its step, tool call or tool result. */
  step?: HarnessStep;
}

export type SandboxEventDetails = Partial<
  Pick<SandboxEvent, "durationMs" | "image" | "network" | "limits" | "exitCode" | "signal" | "oomKilled" | "usage" | "error">
>;

/**
 * Publishes the job and sandbox events of one attempt, numbered (`seq`) in the order they
 * happen. `started` is stored at once; the events after it are held back for the attempt's first
 * `holdMs` (the worker's `eventHoldMs`, 250 ms by default): one that ends by then stores its last
 * event with them in `folded` (a no-op job stores two messages, where it stored seven). After
 * that, the held events and every later one are published as they come.
 * Publishes are not waited for one by one: they go out in order on the worker's one connection,
 * which NATS delivers, and the stream stores, in order. The promise a call returns settles when
 * that event and all before it are stored (at once for a held one); a failed publish is logged
 * and does not stop the job. An event JetStream refuses for want of storage waits for room
 * (`RoomWait`, bounded as the attempt's results are), and every later event waits behind it, so
 * that they are stored in order; past the bound, or once the run stops for good, they are
 * dropped, logged.
 */
export class JobEvents {
  private tail: Promise<void> = Promise.resolve();
  private queuedProgress = 0;
  private seq = 0;
  /** Events held back while the attempt is young; null once events go out as they come. */
  private held: (JobEvent | SandboxEvent)[] | null;
  private liveTimer: NodeJS.Timeout | undefined;
  /** Events refused for want of storage and those after them, stored one by one once there is room; how many wait. */
  private backlog: Promise<void> = Promise.resolve();
  private backlogged = 0;
  attempt = 0;

  constructor(
    private readonly topology: Topology,
    private readonly ids: { jobId: string; owner: string; agent: string; workerId: string; run?: string },
    private readonly log: Logger,
    private readonly holdMs: number,
    /** Every event is redacted by it before it is published, whatever its fields. */
    private readonly redactor: Pick<Redactor, "json" | "active">,
    /** The attempt's wait for room: events the store refuses wait in it. */
    private readonly room: Pick<RoomWait, "store">,
  ) {
    this.held = holdMs > 0 ? [] : null;
  }

  job(type: JobEventType, state: JobState, details: JobEventDetails = {}): Promise<void> {
    return this.record({
      v: PROTOCOL_VERSION,
      at: nowIso(),
      kind: "job",
      type,
      jobId: this.ids.jobId,
      owner: this.ids.owner,
      agent: this.ids.agent,
      state,
      attempt: this.attempt,
      workerId: this.ids.workerId,
      ...(this.ids.run ? { run: this.ids.run } : {}),
      ...details,
      seq: ++this.seq,
    });
  }

  /** Publishes the event of a step of the job's record (the job store's, once the record is written) as one of this attempt's. */
  announce(event: JobEvent): Promise<void> {
    return this.record({ ...event, workerId: this.ids.workerId, seq: ++this.seq });
  }

  sandbox(type: SandboxEventType, ref: SandboxRef, details: SandboxEventDetails = {}): Promise<void> {
    return this.record({
      v: PROTOCOL_VERSION,
      at: nowIso(),
      kind: "sandbox",
      type,
      jobId: this.ids.jobId,
      owner: this.ids.owner,
      attempt: this.attempt,
      workerId: this.ids.workerId,
      ...ref,
      ...details,
      seq: ++this.seq,
    });
  }

  /** Queues a progress event without waiting for it. */
  progress(message: string, sandbox: SandboxInfo | undefined): void {
    if (this.queuedProgress >= MAX_QUEUED_PROGRESS) {
      this.log.debug({ message }, "progress event dropped: too many waiting");
      return;
    }
    this.queuedProgress += 1;
    void this.job("progress", "running", { message, ...(sandbox ? { sandbox } : {}) }).finally(() => {
      this.queuedProgress -= 1;
    });
  }

  /** Publishes whatever is held back, and every later event as it comes: the attempt is no longer short, or is over. */
  goLive(): void {
    clearTimeout(this.liveTimer);
    const held = this.held ?? [];
    this.held = null;
    for (const event of held) void this.enqueue(event);
  }

  private record(event: JobEvent | SandboxEvent): Promise<void> {
    // `started` is stored at once: if the worker dies, the history still shows the attempt began.
    if (this.held === null || (event.kind === "job" && event.type === "started")) return this.enqueue(event);
    if (event.kind === "job" && ATTEMPT_ENDS.has(event.type)) {
      const folded = this.held;
      this.held = [];
      this.goLive();
      return this.enqueue(folded.length > 0 ? { ...event, folded } : event);
    }
    this.held.push(event);
    if (this.held.length >= MAX_HELD) this.goLive();
    else if (!this.liveTimer) this.liveTimer = setTimeout(() => this.goLive(), this.holdMs).unref();
    return this.tail;
  }

  /**
   * Publishes an event of the job's outside the attempt's numbered sequence (a usage report),
   * deduplicated by `msgID`; a failed publish rejects.
   */
  async publishApart(event: JobEvent, msgID: string): Promise<void> {
    await publishEvent(this.topology, this.redacted(event), msgID);
  }

  /**
   * The event with every string an agent could have put in it redacted; its identity (who, which
   * job, attempt and worker, what kind: the system's words, which its subject is made of) kept as
   * it was, whatever a piece of a secret might look like.
   */
  private redacted<E extends BoxcarEvent>(event: E): E {
    if (!this.redactor.active) return event; // an agent with no secrets: nothing to take out
    const identity = Object.fromEntries(IDENTITY.filter((k) => k in event).map((k) => [k, (event as Record<string, unknown>)[k]]));
    const folded =
      "folded" in event && Array.isArray(event.folded) ? { folded: event.folded.map((e: BoxcarEvent) => this.redacted(e)) } : {};
    return { ...this.redactor.json(event), ...identity, ...folded };
  }

  private enqueue(event: BoxcarEvent): Promise<void> {
    const redacted = this.redacted(event);
    const stored =
      this.backlogged > 0
        ? this.afterRoom(redacted)
        : publishEvent(this.topology, redacted).catch((err: unknown) =>
            isStorageFull(err) ? this.afterRoom(redacted) : this.dropped(redacted, err),
          );
    this.tail = Promise.all([this.tail, stored]).then(() => undefined);
    return this.tail;
  }

  /** Stores an event once the store has room, after those refused before it. */
  private afterRoom(event: BoxcarEvent): Promise<void> {
    this.backlogged += 1;
    this.backlog = this.backlog
      .then(() => this.room.store("the job's events", () => publishEvent(this.topology, event), { bounded: true }))
      .catch((err: unknown) => this.dropped(event, err))
      .finally(() => {
        this.backlogged -= 1;
      });
    return this.backlog;
  }

  private async dropped(event: BoxcarEvent, err: unknown): Promise<void> {
    this.log.warn({ err, event: `${event.kind}.${event.type}` }, "could not publish event");
  }
}
