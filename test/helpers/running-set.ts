import { type BoxcarEvent, isTerminal } from "@boxcar/protocol";
import type { NatsConnection } from "@nats-io/transport-node";

/**
 * Follows every job event of a system as it is published, keeping which jobs run (started, not
 * yet ended) in each group `groupsOf` puts a job in (its key, its agent, its pool...), the most
 * that ever ran at once per group, and each group's ends in the order they came.
 */
export function runningSet(nc: NatsConnection, prefix: string, groupsOf: (jobId: string) => readonly string[]) {
  const running = new Map<string, Set<string>>();
  const most = new Map<string, number>();
  const ended: string[] = [];
  const sub = nc.subscribe(`${prefix}.evt.job.>`);
  void (async () => {
    for await (const msg of sub) {
      const event = msg.json<BoxcarEvent>();
      if (event.kind !== "job") continue;
      for (const group of groupsOf(event.jobId)) {
        const now = running.get(group) ?? new Set<string>();
        running.set(group, now);
        if (event.type === "started") now.add(event.jobId);
        else if (isTerminal(event.state) || event.type === "requeued" || event.type === "retrying") {
          if (now.delete(event.jobId) && isTerminal(event.state)) ended.push(group);
        }
        most.set(group, Math.max(most.get(group) ?? 0, now.size));
      }
    }
  })();
  return { most, ended, stop: () => sub.unsubscribe() };
}
