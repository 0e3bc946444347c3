import { type BoxcarEvent, isTerminal, type JobEvent } from "@boxcar/protocol";
import type { NatsConnection } from "@nats-io/transport-node";

/** Whether an event tells that its job stopped running (it ended, or went back to wait). */
const stops = (event: JobEvent) => isTerminal(event.state) || event.type === "requeued" || event.type === "retrying";

/**
 * Follows every job event of a system as it is published, keeping each group's ends in the
 * order they came (`groupsOf` puts a job in groups: its key, its agent, its pool...), and the most
 * that ever ran at once per group.
 *
 * `most` orders the events by their `at`, when each transition was decided, not by arrival:
 * events from several processes can arrive in another order than they happened (a job's end is
 * written, read by a dispatcher that gives its place to the next job, and that job's `started`
 * published, before the first worker publishes its `succeeded`).
 */
export function runningSet(nc: NatsConnection, prefix: string, groupsOf: (jobId: string) => readonly string[]) {
  const events: JobEvent[] = [];
  const ended: string[] = [];
  const sub = nc.subscribe(`${prefix}.evt.job.>`);
  void (async () => {
    for await (const msg of sub) {
      const event = msg.json<BoxcarEvent>();
      if (event.kind !== "job") continue;
      events.push(event);
      if (isTerminal(event.state)) ended.push(...groupsOf(event.jobId));
    }
  })();
  const most = () => {
    const inOrder = events
      .map((event, arrived) => ({ event, arrived, at: Date.parse(event.at) }))
      .sort((a, b) => a.at - b.at || Number(stops(b.event)) - Number(stops(a.event)) || a.arrived - b.arrived);
    const running = new Map<string, Set<string>>();
    const most = new Map<string, number>();
    for (const { event } of inOrder) {
      for (const group of groupsOf(event.jobId)) {
        const now = running.get(group) ?? new Set<string>();
        running.set(group, now);
        if (event.type === "started") now.add(event.jobId);
        else if (stops(event)) now.delete(event.jobId);
        most.set(group, Math.max(most.get(group) ?? 0, now.size));
      }
    }
    return most;
  };
  return {
    ended,
    get most() {
      return most();
    },
    stop: () => sub.unsubscribe(),
  };
}
