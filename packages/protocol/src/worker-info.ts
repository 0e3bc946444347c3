import { z } from "zod";
import { PoolName, PROTOCOL_VERSION } from "./agent.js";

export const WorkerState = z.enum(["running", "draining", "stopped"]);
export type WorkerState = z.infer<typeof WorkerState>;

/** What a worker advertises in the workers bucket, refreshed with every heartbeat. */
export const WorkerInfo = z.strictObject({
  v: z.literal(PROTOCOL_VERSION),
  id: z.string(),
  host: z.string(),
  pid: z.number().int(),
  pools: z.array(PoolName).min(1),
  sandboxes: z.array(z.enum(["host", "docker", "e2b"])),
  capacity: z.number().int().positive(),
  load: z.number().int().nonnegative(),
  jobs: z.array(z.string()),
  state: WorkerState,
  startedAt: z.iso.datetime(),
  heartbeatAt: z.iso.datetime(),
  /** How often this worker heartbeats: a presence older than a few of these means it is gone. */
  heartbeatMs: z.number().int().positive(),
});
export type WorkerInfo = z.infer<typeof WorkerInfo>;
