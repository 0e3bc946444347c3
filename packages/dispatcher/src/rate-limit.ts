import { isRevisionConflict, type Topology } from "@boxcar/fabric";
import { type AgentDefinition, BoxcarError, ErrorCode } from "@boxcar/protocol";

/** How many times a reservation tries again when another dispatcher changed the limit's state first. */
const TRIES = 50;

type RateLimit = NonNullable<AgentDefinition["rateLimit"]>;

/**
 * Reserves a start for a job of `agent` under its rate limit (docs/flow-control.md#rate-limits):
 * the time (ms since the epoch), not before `earliest`, at which it may start. The limit is the
 * generic cell rate algorithm: starts `per / starts` apart, up to `burst` at once after a quiet
 * spell, its one number (when the next start is due, its "theoretical arrival time") kept in the
 * limits bucket under the agent's name and changed by compare-and-swap, so every dispatcher
 * reserves from the same schedule, with no lock. A reservation is made at admission; a job
 * cancelled before its start does not give its place back.
 */
export async function reserveStart(topology: Topology, agent: string, limit: RateLimit, earliest: number): Promise<number> {
  const bucket = await topology.limits();
  const interval = limit.per / limit.starts;
  const tolerance = interval * (limit.burst - 1);
  for (let i = 0; i < TRIES; i++) {
    const entry = await bucket.get(agent);
    const due = entry && entry.operation === "PUT" ? dueOf(entry.string()) : undefined;
    const tat = Math.max(due ?? 0, earliest);
    const start = Math.max(earliest, tat - tolerance);
    const next = JSON.stringify({ due: tat + interval });
    try {
      if (entry && entry.operation === "PUT") await bucket.update(agent, next, entry.revision);
      else await bucket.create(agent, next);
      return start;
    } catch (err) {
      if (!isRevisionConflict(err)) throw err;
    }
  }
  throw new BoxcarError(ErrorCode.unavailable, `too many jobs of ${agent} reserved their start at once: submit again`);
}

function dueOf(text: string): number | undefined {
  try {
    const due = (JSON.parse(text) as { due?: unknown }).due;
    return typeof due === "number" && Number.isFinite(due) ? due : undefined;
  } catch {
    return undefined;
  }
}
