import { type LatencySummary, summarize } from "./stats.js";

/** One way of running a no-op job end to end; resolves once the job's final record is seen. */
export type RunJob = (i: number) => Promise<void>;

/**
 * Final records seen by one shared watcher, matched to the jobs waiting for them. A record may
 * arrive before its submitter learns the job id (the id comes back in the submit reply), so
 * early arrivals are kept until they are claimed.
 */
export class Completions {
  private readonly waiting = new Map<string, () => void>();
  private readonly early = new Set<string>();

  wait(id: string): Promise<void> {
    if (this.early.delete(id)) return Promise.resolve();
    return new Promise((resolve) => this.waiting.set(id, resolve));
  }

  complete(id: string): void {
    const resolve = this.waiting.get(id);
    if (resolve) {
      this.waiting.delete(id);
      resolve();
    } else {
      this.early.add(id);
    }
  }
}

/** Runs `count` jobs one after another; returns each round trip in ms. */
export async function sequential(run: RunJob, count: number, first = 0): Promise<number[]> {
  const latencies: number[] = [];
  for (let i = 0; i < count; i++) {
    const start = performance.now();
    await run(first + i);
    latencies.push(performance.now() - start);
  }
  return latencies;
}

export interface Saturation {
  jobs: number;
  inFlight: number;
  seconds: number;
  jobsPerSecond: number;
  /** Round trips under load: queueing included. */
  latency: LatencySummary;
}

/** Runs `count` jobs keeping `inFlight` of them going at all times (a closed loop). */
export async function saturate(run: RunJob, count: number, inFlight: number, first = 0): Promise<Saturation> {
  const latencies: number[] = [];
  let next = 0;
  const lane = async () => {
    while (next < count) {
      const i = next++;
      const start = performance.now();
      await run(first + i);
      latencies.push(performance.now() - start);
    }
  };
  const start = performance.now();
  await Promise.all(Array.from({ length: Math.min(inFlight, count) }, lane));
  const seconds = (performance.now() - start) / 1000;
  return { jobs: count, inFlight, seconds, jobsPerSecond: count / seconds, latency: summarize(latencies) };
}
