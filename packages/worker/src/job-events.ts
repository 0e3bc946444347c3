import { type Logger, nowIso, publishEvent, type Topology } from "@boxcar/client";
import {
  type BoxcarEvent,
  type ErrorInfo,
  type JobEventType,
  type JobState,
  PROTOCOL_VERSION,
  type SandboxEvent,
  type SandboxEventType,
  type SandboxInfo,
} from "@boxcar/protocol";
import type { SandboxBackend } from "./sandbox.js";

/** Progress events waiting beyond this many are dropped: a chatty agent cannot flood the stream. */
const MAX_QUEUED_PROGRESS = 64;

export interface SandboxRef {
  backend: SandboxBackend;
  sandboxId: string;
}

export interface JobEventDetails {
  sandbox?: SandboxInfo;
  message?: string;
  error?: ErrorInfo;
}

export type SandboxEventDetails = Partial<
  Pick<SandboxEvent, "durationMs" | "image" | "network" | "limits" | "exitCode" | "signal" | "oomKilled" | "usage" | "error">
>;

/**
 * Publishes the job and sandbox events of one attempt in order without waiting for each to be
 * stored: every publish is sent at once on the worker's one connection, which NATS delivers,
 * and the stream stores, in order. The promise a call returns settles when that event and all
 * before it are stored; a failed publish is logged and does not stop the job.
 */
export class JobEvents {
  private tail: Promise<void> = Promise.resolve();
  private queuedProgress = 0;
  attempt = 0;

  constructor(
    private readonly topology: Topology,
    private readonly ids: { jobId: string; owner: string; agent: string; workerId: string; run?: string },
    private readonly log: Logger,
  ) {}

  job(type: JobEventType, state: JobState, details: JobEventDetails = {}): Promise<void> {
    return this.enqueue({
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
    });
  }

  sandbox(type: SandboxEventType, ref: SandboxRef, details: SandboxEventDetails = {}): Promise<void> {
    return this.enqueue({
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

  private enqueue(event: BoxcarEvent): Promise<void> {
    const stored = publishEvent(this.topology, event).catch((err: unknown) => {
      this.log.warn({ err, event: `${event.kind}.${event.type}` }, "could not publish event");
    });
    this.tail = Promise.all([this.tail, stored]).then(() => undefined);
    return this.tail;
  }
}
