/** Exit codes scripts can rely on. */
export const ExitCode = {
  ok: 0,
  /** The job ended, but not `succeeded` (submit --wait/--follow, status --wait). */
  jobFailed: 1,
  /** Bad flags, arguments or files: nothing was sent. */
  usage: 2,
  /** The system refused the request: invalid, unknown agent, not found, conflict. */
  refused: 3,
  /** NATS or the dispatcher could not be reached. */
  unavailable: 4,
  /** Anything else. */
  internal: 5,
} as const;
export type ExitCode = (typeof ExitCode)[keyof typeof ExitCode];
