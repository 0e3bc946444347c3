import {
  BoxcarError,
  BoxcarEvent,
  ErrorCode,
  handoffPending,
  isRunFinal,
  isTerminal,
  JobRecord,
  parseWith,
  type WorkflowRun as Run,
  WorkflowRun,
} from "@boxcar/protocol";
import type { KV } from "@nats-io/kv";
import type { z } from "zod";
import type { FollowOptions } from "./client.js";
import { getJson } from "./kv-json.js";
import { readStream } from "./stream-reader.js";
import type { Topology } from "./topology.js";

/** Watches one KV entry until `done` says its value is the one wanted. */
export async function watchUntil<S extends z.ZodType>(
  kv: KV,
  key: string,
  schema: S,
  what: string,
  done: (value: z.infer<S>) => boolean,
  signal?: AbortSignal,
): Promise<z.infer<S>> {
  const watch = await kv.watch({ key });
  const onAbort = () => watch.stop();
  signal?.addEventListener("abort", onAbort, { once: true });
  try {
    for await (const entry of watch) {
      if (entry.operation !== "PUT") continue;
      const value = parseWith(schema, entry.json(), `${what} ${key}`);
      if (done(value)) return value;
    }
    throw new BoxcarError(ErrorCode.cancelled, `stopped waiting for ${what} ${key}`);
  } finally {
    signal?.removeEventListener("abort", onAbort);
    watch.stop();
  }
}

/** The last job of the chain `jobId` starts, once it has ended (its handoff, if any, decided and followed). */
export async function waitForChainEnd(topology: Topology, jobId: string, signal?: AbortSignal): Promise<JobRecord> {
  for (let id = jobId; ; ) {
    const job = await watchUntil(topology.jobs, id, JobRecord, "job record", (j) => isTerminal(j.state) && !handoffPending(j), signal);
    if (!job.handoff?.jobId) return job;
    id = job.handoff.jobId;
  }
}

/** A run once it has ended and none of its jobs is still going. */
export function waitForRunEnd(topology: Topology, runId: string, signal?: AbortSignal): Promise<Run> {
  return watchUntil(topology.workflows, runId, WorkflowRun, "workflow run", (run) => isRunFinal(run.state) && !hasJobsGoing(run), signal);
}

const hasJobsGoing = (run: Run): boolean =>
  Object.values(run.steps).some((s) => s.instances.some((i) => i.state === "running" || i.state === "starting"));

/**
 * The events of a job and of the jobs it hands off to, one job after the other. With `follow`
 * it waits for each job's handoff decision and ends with the chain's last job.
 */
export async function* followChain(topology: Topology, jobId: string, opts: FollowOptions = {}): AsyncGenerator<BoxcarEvent> {
  const { names } = topology;
  for (let id: string | undefined = jobId; id !== undefined; ) {
    const current: string = id;
    id = undefined;
    for await (const msg of readStream(topology, names.streams.events, names.subjects.jobEvents(current), opts)) {
      const event = parseWith(BoxcarEvent, msg.json(), `event ${msg.subject}`);
      yield event;
      if (event.kind !== "job") continue;
      if (event.type === "handoff") {
        id = event.next;
        break;
      }
      if (!opts.follow) continue;
      if (event.type === "handoff_refused") break;
      if (isTerminal(event.state)) {
        // Only a succeeded job's handoff is decided: wait for the decision, else the chain ends here.
        const record = (await getJson(topology.jobs, current, JobRecord, "job record"))?.value;
        if (!record || !(handoffPending(record) || record.handoff)) break;
      }
    }
  }
}

/**
 * A run's events and the events of its jobs (and their sandboxes), in the order they were
 * stored. With `follow`, until the run's final event.
 */
export async function* followRun(topology: Topology, runId: string, opts: FollowOptions = {}): AsyncGenerator<BoxcarEvent> {
  const run = await getJson(topology.workflows, runId, WorkflowRun, "workflow run");
  if (!run) throw new BoxcarError(ErrorCode.notFound, `no workflow run ${runId}`);
  const { names, options } = topology;
  const filters = [names.subjects.runEvents(runId), `${options.prefix}.evt.job.>`, `${options.prefix}.evt.sandbox.>`];
  const jobs = new Set<string>();
  // A margin for clocks that differ between the dispatcher that stamped the run and the server.
  const startTime = new Date(Date.parse(run.value.createdAt) - 5_000).toISOString();
  for await (const msg of readStream(topology, names.streams.events, filters, { ...opts, startTime })) {
    const event = parseWith(BoxcarEvent, msg.json(), `event ${msg.subject}`);
    if (event.kind === "job" && event.run === runId) jobs.add(event.jobId);
    const ours =
      (event.kind === "workflow" && event.runId === runId) ||
      (event.kind === "job" && event.run === runId) ||
      (event.kind === "sandbox" && jobs.has(event.jobId));
    if (!ours) continue;
    yield event;
    if (opts.follow && event.kind === "workflow" && ["succeeded", "failed", "cancelled"].includes(event.type)) return;
  }
}
