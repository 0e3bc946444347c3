import type { CommandEntry } from "./command.js";

/**
 * Every `boxcar` subcommand, in the order `boxcar --help` lists them: its name and summary here,
 * its flags and code in its module, imported only when it runs. `boxcar --help` and
 * `boxcar --version` load none of them, and a command loads only what it uses (`jobs` neither the
 * dispatcher, the worker nor Docker).
 */
export const COMMANDS: readonly CommandEntry[] = [
  {
    name: "up",
    summary: "start a local nats-server, a dispatcher and workers, and apply the example agents",
    load: async () => (await import("./commands/up.js")).up,
  },
  {
    name: "dispatcher",
    summary: "run a dispatcher until SIGINT/SIGTERM",
    load: async () => (await import("./commands/dispatcher.js")).dispatcher,
  },
  {
    name: "worker",
    summary: "run a worker until SIGINT/SIGTERM (then it drains)",
    load: async () => (await import("./commands/worker.js")).worker,
  },
  {
    name: "agent",
    summary: "apply, list, show or remove agent definitions",
    load: async () => (await import("./commands/agent.js")).agent,
  },
  { name: "submit", summary: "submit a job to an agent", load: async () => (await import("./commands/jobs.js")).submit },
  { name: "status", summary: "show a job's state and result", load: async () => (await import("./commands/jobs.js")).status },
  {
    name: "logs",
    summary: "print a job's output (stdout to stdout, stderr to stderr)",
    load: async () => (await import("./commands/jobs.js")).logs,
  },
  {
    name: "events",
    summary: "print a job's job and sandbox events in order, then those of the jobs it handed off to (--no-chain: only its own)",
    load: async () => (await import("./commands/jobs.js")).events,
  },
  {
    name: "artifacts",
    summary: "list a job's artifacts, or download them into DIR",
    load: async () => (await import("./commands/jobs.js")).artifacts,
  },
  { name: "cancel", summary: "cancel a queued or running job", load: async () => (await import("./commands/jobs.js")).cancel },
  {
    name: "signal",
    summary: "send a job a signal: a file in its workspace ($BOXCAR_SIGNALS_DIR) and an event (a job not started keeps it until it starts)",
    load: async () => (await import("./commands/jobs.js")).signal,
  },
  {
    name: "retry",
    summary: "run an ended job again (dead, failed, timed out or cancelled; or every dead job of an agent), its history kept",
    load: async () => (await import("./commands/jobs.js")).retry,
  },
  {
    name: "rerun",
    summary: "run an ended job's spec again as a new job, with a new input if given",
    load: async () => (await import("./commands/jobs.js")).rerun,
  },
  {
    name: "clean",
    summary: "delete now the ended jobs that match, with their events, output and files (admins)",
    load: async () => (await import("./commands/clean.js")).clean,
  },
  { name: "jobs", summary: "list jobs, newest first; or count them by state", load: async () => (await import("./commands/jobs.js")).jobs },
  {
    name: "schedule",
    summary: "create, update, list, show, pause, resume or delete schedules: a job submitted at each tick of a cron",
    load: async () => (await import("./commands/schedule.js")).schedule,
  },
  {
    name: "usage",
    summary: "what the agents' calls used in a day (UTC), per agent and per user: calls, tokens, cost",
    load: async () => (await import("./commands/usage.js")).usage,
  },
  {
    name: "run",
    summary: "start a workflow run from a workflow file (and wait for it, or follow it)",
    load: async () => (await import("./commands/run.js")).run,
  },
  {
    name: "workflow",
    summary: "show, follow, cancel or list workflow runs; approve or reject a step that waits",
    load: async () => (await import("./commands/workflow.js")).workflow,
  },
  {
    name: "workers",
    summary: "list workers (live, draining, gone) with their load, and what became of a gone worker's jobs",
    load: async () => (await import("./commands/workers.js")).workers,
  },
  {
    name: "policy",
    summary: "show or set the system policy: what agents may ask for, and users' quotas",
    load: async () => (await import("./commands/policy.js")).policy,
  },
  {
    name: "auth",
    summary: "create NATS credentials for Boxcar's roles, mint, list, revoke and rotate users",
    load: async () => (await import("./commands/auth.js")).auth,
  },
  {
    name: "backup",
    summary: "copy everything the system keeps in JetStream (records, work, history, files) to FILE while it runs",
    load: async () => (await import("./commands/backup.js")).backup,
  },
  {
    name: "restore",
    summary: "make a system anew from a backup, on a NATS system that has none of its streams",
    load: async () => (await import("./commands/backup.js")).restore,
  },
  {
    name: "session",
    summary: "open a session (a sandbox kept between commands), run commands in it, open a shell in it, pause and resume it, close it",
    load: async () => (await import("./commands/session.js")).session,
  },
  { name: "sessions", summary: "list sessions, newest first", load: async () => (await import("./commands/session.js")).sessions },
  {
    name: "snapshots",
    summary: "list the snapshots of sessions' workspaces, newest first, or remove one",
    load: async () => (await import("./commands/session.js")).snapshots,
  },
  {
    name: "ui",
    summary: "serve the web dashboard, which talks to NATS over its WebSocket listener",
    load: async () => (await import("./commands/ui.js")).ui,
  },
];
