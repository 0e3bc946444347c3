import type { NatsConnection } from "@nats-io/transport-node";
import { summarize } from "./stats.js";

/** One kind of request/reply a role makes, per job. */
export interface RoundTripRow {
  role: string;
  /** What the request is, e.g. `kv update jobs` or `publish event`. */
  op: string;
  /** For events: their kinds and types, in the order first seen. */
  detail: string[];
  perJob: number;
  p50Ms: number;
  meanMs: number;
  /** perJob × meanMs. */
  msPerJob: number;
}

interface Tally {
  samples: number[];
  detail: Set<string>;
}

const EXPECTED_LAST_SUBJECT_SEQ = "Nats-Expected-Last-Subject-Sequence";

/**
 * Counts and times every request/reply a connection makes: JetStream publishes (events, work
 * items, KV writes), KV reads (direct get), JetStream API calls and Boxcar API requests all go
 * through `nc.request`. `ackAck` does not (it is counted by the caller), nor do plain publishes
 * such as acks and pull requests, which show in the connection's message counts.
 */
export class RoundTripLog {
  private readonly tallies = new Map<string, Tally>();

  /** Wraps `nc.request`; returns a function that puts it back. */
  attach(role: string, nc: NatsConnection, prefix: string): () => void {
    const original = nc.request;
    const request: NatsConnection["request"] = async (subject, payload, opts) => {
      const start = performance.now();
      try {
        return await original.call(nc, subject, payload, opts);
      } finally {
        const { op, detail } = classify(subject, opts?.headers?.get(EXPECTED_LAST_SUBJECT_SEQ), prefix);
        this.add(role, op, detail, performance.now() - start);
      }
    };
    nc.request = request;
    return () => {
      nc.request = original;
    };
  }

  rows(jobs: number): RoundTripRow[] {
    return [...this.tallies].map(([key, t]) => {
      const [role = "", op = ""] = key.split("|");
      const latency = summarize(t.samples);
      const perJob = latency.count / jobs;
      return { role, op, detail: [...t.detail], perJob, p50Ms: latency.p50, meanMs: latency.mean, msPerJob: perJob * latency.mean };
    });
  }

  private add(role: string, op: string, detail: string | undefined, elapsed: number): void {
    const key = `${role}|${op}`;
    let tally = this.tallies.get(key);
    if (!tally) {
      tally = { samples: [], detail: new Set() };
      this.tallies.set(key, tally);
    }
    tally.samples.push(elapsed);
    if (detail) tally.detail.add(detail);
  }
}

function classify(subject: string, expectedSeq: string | undefined, prefix: string): { op: string; detail?: string } {
  const bucketName = (b: string) => (b.startsWith(`${prefix}_`) ? b.slice(prefix.length + 1) : b);
  const direct = /^\$JS\.API\.DIRECT\.GET\.KV_([^.]+)/.exec(subject);
  if (direct) return { op: `kv get ${bucketName(direct[1] ?? "")}` };
  if (subject.startsWith("$KV.")) {
    const bucket = bucketName(subject.split(".")[1] ?? "");
    const op = expectedSeq === undefined ? "put" : expectedSeq === "0" ? "create" : "update";
    return { op: `kv ${op} ${bucket}` };
  }
  if (subject.startsWith(`${prefix}.evt.`)) {
    const [, , kind, , type] = subject.split(".");
    return { op: "publish event", detail: `${kind}.${type}` };
  }
  if (subject.startsWith(`${prefix}.work.`)) return { op: "publish work item" };
  if (subject.startsWith(`${prefix}.log.`)) return { op: "publish log chunk" };
  if (subject.startsWith(`${prefix}.api.`)) return { op: `request ${subject.slice(prefix.length + 5)}` };
  if (subject.startsWith("$JS.API.")) return { op: `js api ${subject.split(".").slice(2, 4).join(".")}` };
  return { op: "publish or request", detail: subject };
}

/** Messages a connection has sent and received so far. */
export interface MessageCounts {
  out: number;
  in: number;
}

export function messageCounts(nc: NatsConnection): MessageCounts {
  const s = nc.stats();
  return { out: s.outMsgs, in: s.inMsgs };
}
