import type { Topology } from "@boxcar/fabric";
import { recordedCallObject } from "@boxcar/protocol";
import type { CallRecorder, RecordedAnswer } from "./gateway.js";

/**
 * A job's recorded model calls (docs/models.md#recorded-calls), in the Object Store beside its
 * artifacts: one object per place in an attempt's sequence, `modelcalls/<job>/<place>`, holding
 * the hash of the request and the answer the agent got (status, headers, body). The request
 * itself is not kept. Retention removes them with the job.
 */
export function recordedCalls(topology: Pick<Topology, "artifacts">, jobId: string): CallRecorder {
  const name = (position: number) => recordedCallObject(jobId, position);
  return {
    async replay(position, hash) {
      const object = await topology.artifacts.getBlob(name(position));
      if (!object) return undefined;
      const stored = JSON.parse(new TextDecoder().decode(object)) as {
        hash: string;
        status: number;
        headers: Record<string, string>;
        body: string;
      };
      if (stored.hash !== hash) return undefined;
      return { status: stored.status, headers: stored.headers, body: Buffer.from(stored.body, "base64") } satisfies RecordedAnswer;
    },
    async record(position, hash, answer) {
      const stored = { hash, status: answer.status, headers: answer.headers, body: answer.body.toString("base64") };
      await topology.artifacts.putBlob({ name: name(position) }, new TextEncoder().encode(JSON.stringify(stored)));
    },
  };
}
