/**
 * A job container's use of CPU, memory and processes, sampled from the engine's stats stream
 * while the agent runs, for its `ExecResult.usage`.
 */

import type { ResourceUsage } from "@boxcar/protocol";
import type Docker from "dockerode";

/** How long a run goes before its resource use is sampled. */
export const USAGE_AFTER_MS = 1_000;

/** Samples the container's use of CPU, memory and processes while it runs. */
export class UsageMeter {
  private cpuNs = 0;
  private memoryPeak = 0;
  private pidsPeak = 0;
  private samples = 0;

  async follow(container: Docker.Container): Promise<void> {
    try {
      const stream = (await container.stats({ stream: true })) as unknown as NodeJS.ReadableStream;
      let buffered = "";
      for await (const chunk of stream) {
        buffered += chunk.toString();
        let newline = buffered.indexOf("\n");
        while (newline >= 0) {
          this.sample(buffered.slice(0, newline));
          buffered = buffered.slice(newline + 1);
          newline = buffered.indexOf("\n");
        }
      }
    } catch {
      // the container ended: nothing more to sample
    }
  }

  private sample(line: string): void {
    if (!line.trim()) return;
    this.samples += 1;
    const stats = JSON.parse(line) as {
      cpu_stats?: { cpu_usage?: { total_usage?: number } };
      memory_stats?: { max_usage?: number; usage?: number };
      pids_stats?: { current?: number };
    };
    this.cpuNs = Math.max(this.cpuNs, stats.cpu_stats?.cpu_usage?.total_usage ?? 0);
    this.memoryPeak = Math.max(this.memoryPeak, stats.memory_stats?.max_usage ?? stats.memory_stats?.usage ?? 0);
    this.pidsPeak = Math.max(this.pidsPeak, stats.pids_stats?.current ?? 0);
  }

  /** Nothing when the run ended before the engine's first sample (about a second). */
  result(): ResourceUsage | undefined {
    if (this.samples === 0) return undefined;
    return { cpuMs: Math.round(this.cpuNs / 1e6), memoryPeakBytes: this.memoryPeak, pidsPeak: this.pidsPeak };
  }
}
