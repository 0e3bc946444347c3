import { z } from "zod";

/**
 * A job's priority within its pool. A worker takes a pool's waiting `high` jobs before its
 * `normal` ones, and those before its `low` ones; jobs of one priority start in the order they
 * were queued. Each priority has its own work subject and consumer (JetStream before 2.11 has no
 * per-message priority), so a waiting `high` job never sits behind a backlog of others.
 */
export const Priority = z.enum(["high", "normal", "low"]);
export type Priority = z.infer<typeof Priority>;

/** The priorities, the one served first first. */
export const PRIORITIES: readonly Priority[] = Priority.options;
