/**
 * One attempt at a time: a job never runs again while an earlier attempt's agent is still alive.
 *
 * Real worker processes, real agents and real containers: a worker is SIGKILLed, frozen
 * (SIGSTOP) past its lease, or cut off from NATS (a TCP proxy that stops passing bytes), and
 * the test looks at what is left of the attempt's agent in the process table (host) or in the
 * Docker engine, and at the agents' own stamps.
 *
 * An agent's processes are found by a mark: a random value in a variable of the agent
 * definition's `env`, which every process of the agent inherits; `/proc/<pid>/environ` says
 * which processes carry it, and with `BOXCAR_JOB_ID` and `BOXCAR_ATTEMPT` (also inherited) whose
 * attempt they are.
 */

import { randomBytes } from "node:crypto";
import { readdirSync, readFileSync } from "node:fs";
import { readFile } from "node:fs/promises";
import { join } from "node:path";
import type { BoxcarClient } from "@boxcar/client";
import { isTerminal, type JobEvent, type JobRecord } from "@boxcar/protocol";
import { boxcarContainers, dockerReady, eventually, type NatsFixture, scratch } from "@boxcar/testing";
import { createHostSandboxProvider, createWorker } from "@boxcar/worker";
import Docker from "dockerode";
import { describe, expect, test } from "vitest";
import { exited, spawnBoxcar } from "./helpers/cli.js";
import { leasedSystem } from "./helpers/leased.js";
import { tcpProxy } from "./helpers/lifeline-proxy.js";

/** The pool's lease (JetStream ack wait): an attempt whose lease is not confirmed loses its agent 2.5 s after the last renewal. */
const LEASE_MS = 3_000;
/** The variable that marks an agent's processes (its value is unique to one test). */
const MARK = "ONE_ATTEMPT_MARK";

const system = () => leasedSystem(LEASE_MS);

const newMark = () => `m${randomBytes(8).toString("hex")}`;
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

interface AgentProcess {
  pid: number;
  ppid: number;
  job: string;
  attempt: number;
  /** The command line, for messages. */
  cmd: string;
}

/** Every live process (zombies excluded) whose environment carries the mark. */
function agentProcesses(mark: string): AgentProcess[] {
  const found: AgentProcess[] = [];
  for (const name of readdirSync("/proc")) {
    if (!/^\d+$/.test(name)) continue;
    let environ: string;
    let stat: string;
    let cmd: string;
    try {
      environ = readFileSync(`/proc/${name}/environ`, "latin1");
      if (!environ.includes(`${MARK}=${mark}\0`)) continue;
      stat = readFileSync(`/proc/${name}/stat`, "utf8");
      cmd = readFileSync(`/proc/${name}/cmdline`, "latin1").replaceAll("\0", " ").trim();
    } catch {
      continue; // gone meanwhile
    }
    const [state, ppid] = stat.slice(stat.lastIndexOf(") ") + 2).split(" ");
    if (state === "Z") continue;
    const vars = environ.split("\0");
    const variable = (key: string) => vars.find((v) => v.startsWith(`${key}=`))?.slice(key.length + 1);
    found.push({
      pid: Number(name),
      ppid: Number(ppid),
      job: variable("BOXCAR_JOB_ID") ?? "",
      attempt: Number(variable("BOXCAR_ATTEMPT")),
      cmd,
    });
  }
  return found;
}

/** The parent of `pid`, or undefined when it is gone. */
function parentOf(pid: number): number | undefined {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
    return Number(stat.slice(stat.lastIndexOf(") ") + 2).split(" ")[1]);
  } catch {
    return undefined;
  }
}

/** Whether `ancestor` is `pid`'s parent, grandparent, and so on. */
function descendsFrom(pid: number, ancestor: number): boolean {
  for (let p = parentOf(pid); p !== undefined && p > 1; p = parentOf(p)) if (p === ancestor) return true;
  return false;
}

/** Whether the process ignores SIGTERM (bit 15 of its ignored signals). */
function ignoresTerm(p: AgentProcess): boolean {
  try {
    const mask = /^SigIgn:\s*([0-9a-f]+)$/m.exec(readFileSync(`/proc/${p.pid}/status`, "utf8"))?.[1] ?? "0";
    return (BigInt(`0x${mask}`) & (1n << 14n)) !== 0n;
  } catch {
    return false;
  }
}

/** Kills whatever of the mark's agents is left (a failing test's), so nothing outlives the test. */
function killAgents(mark: string): void {
  for (const p of agentProcesses(mark)) {
    try {
      process.kill(p.pid, "SIGKILL");
    } catch {}
  }
}

/** Polls the mark's processes until none are left or `deadline` passes; returns what is left. */
async function goneBy(mark: string, deadline: number, filter: (p: AgentProcess) => boolean = () => true): Promise<AgentProcess[]> {
  for (;;) {
    const left = agentProcesses(mark).filter(filter);
    if (left.length === 0 || Date.now() > deadline) return left;
    await sleep(20);
  }
}

async function jobEvents(client: BoxcarClient, jobId: string): Promise<JobEvent[]> {
  const events: JobEvent[] = [];
  for await (const e of client.events(jobId)) if (e.kind === "job") events.push(e);
  return events;
}

const typesOf = (events: JobEvent[]) => events.map((e) => `${e.type}:${e.attempt}`);
const outcomesOf = (events: JobEvent[]) => typesOf(events.filter((e) => isTerminal(e.state)));

async function startedAttempt(client: BoxcarClient, jobId: string, attempt: number): Promise<void> {
  await eventually(
    async () => ((await jobEvents(client, jobId)).some((e) => e.type === "started" && e.attempt === attempt) ? true : undefined),
    `attempt ${attempt} of ${jobId} to start`,
  );
}

/** What a worker process needs to log in through another address than the fixture server's own. */
function workerCredentials(nats: NatsFixture): NodeJS.ProcessEnv {
  return { NATS_CREDS: nats.auth.credsFile("worker"), BOXCAR_DISPATCHER_KEYS: join(nats.auth.dir, "dispatchers.pub") };
}

/** One stamp an agent wrote: `<what> <job> <attempt> <pid> <ms since the epoch>`. */
interface Stamp {
  what: string;
  job: string;
  attempt: number;
  pid: number;
  at: number;
}

async function stampsIn(file: string): Promise<Stamp[]> {
  const text = await readFile(file, "utf8").catch(() => "");
  return text
    .split("\n")
    .filter((l) => l.trim() !== "")
    .map((line) => {
      const [what = "", job = "", attempt, pid, at] = line.split(" ");
      return { what, job, attempt: Number(attempt), pid: Number(pid), at: Number(at) };
    });
}

/** A line the agent appends to `$STAMPS` (a file outside its workspace): `<what> <job> <attempt> <pid> <ms>`. */
const stamp = (what: string) => `echo "${what} $BOXCAR_JOB_ID $BOXCAR_ATTEMPT $$ $(date +%s%3N)" >> "$STAMPS"`;

/**
 * Attempt 1 ticks every 100 ms until it is killed; a later attempt runs for `laterMs` and writes
 * its result. Both stamp their start.
 */
function tickingAgent(laterMs: number): string {
  return [
    stamp("start"),
    `if [ "$BOXCAR_ATTEMPT" = 1 ]; then while :; do ${stamp("tick")}; sleep 0.1; done; fi`,
    `sleep ${laterMs / 1000}`,
    stamp("stop"),
    `printf '{"output":"attempt %s"}' "$BOXCAR_ATTEMPT" > "$BOXCAR_RESULT_FILE"`,
  ].join("\n");
}

/**
 * Watches, every 20 ms, for attempt 1's processes to be gone and for attempt 2 to stamp its
 * start; returns when both happened (or after `ms`), with when attempt 1 was first seen gone.
 */
async function watchHandover(mark: string, stamps: string, ms = 25_000): Promise<{ goneAt?: number; start2?: Stamp; ticks1: Stamp[] }> {
  const deadline = Date.now() + ms;
  let goneAt: number | undefined;
  for (;;) {
    const now = Date.now();
    if (goneAt === undefined && agentProcesses(mark).every((p) => p.attempt !== 1)) goneAt = now;
    const all = await stampsIn(stamps);
    const start2 = all.find((s) => s.what === "start" && s.attempt === 2);
    if ((goneAt !== undefined && start2) || now > deadline) {
      return { goneAt, start2, ticks1: all.filter((s) => s.what === "tick" && s.attempt === 1) };
    }
    await sleep(20);
  }
}

test("host: a worker SIGKILLed mid-job takes its agent's whole process tree (background jobs, orphans, a child that ignores SIGTERM) with it within 2 s", async () => {
  await using s = await system();
  const mark = newMark();
  await s.client.applyAgent({
    name: "tree",
    // A background job, an orphaned grandchild (its subshell exits at once), a child that
    // ignores SIGTERM, and the agent itself: all asleep for 5 minutes.
    command: ["sleep 300 &", "(sleep 300 &)", '(trap "" TERM; sleep 300; echo never) &', "sleep 300"].join("\n"),
    trusted: true,
    runtime: { sandbox: "host" },
    env: { [MARK]: mark },
  });
  const worker = spawnBoxcar(s.nats.url, s.prefix, ["worker"]);
  try {
    const { job } = await s.client.submit({ agent: "tree" });
    await startedAttempt(s.client, job.id, 1);
    // The whole tree is up: the agent's shell, three sleeps, and the subshell ignoring SIGTERM with its sleep.
    const tree = await eventually(async () => {
      const found = agentProcesses(mark);
      return found.filter((p) => p.cmd === "sleep 300").length >= 4 ? found : undefined;
    }, "the agent's process tree");
    expect(tree.every((p) => p.job === job.id && p.attempt === 1)).toBe(true);
    expect(tree.filter(ignoresTerm).length, "processes of the agent that ignore SIGTERM").toBeGreaterThanOrEqual(1);

    worker.kill("SIGKILL");
    const killedAt = Date.now();
    await exited(worker);
    const left = await goneBy(mark, killedAt + 2_000);
    expect(
      left.map((p) => `${p.pid} ${p.cmd}`),
      "the agent's processes still alive 2 s after its worker was SIGKILLed",
    ).toEqual([]);
  } finally {
    worker.kill("SIGKILL");
    await exited(worker);
    killAgents(mark);
  }
});

test("host: a worker frozen (SIGSTOP) past its lease loses its agent before the job runs again; woken up (SIGCONT), it writes nothing for its attempt", async () => {
  await using s = await system();
  await using dir = await scratch("boxcar-one-attempt-");
  const stamps = join(dir.path, "stamps.txt");
  const mark = newMark();
  await s.client.applyAgent({
    name: "ticker",
    command: tickingAgent(4_000),
    trusted: true,
    runtime: { sandbox: "host" },
    env: { [MARK]: mark, STAMPS: stamps },
  });
  const stale = spawnBoxcar(s.nats.url, s.prefix, ["worker", "--heartbeat", "500ms"]);
  try {
    const staleId = await eventually(
      async () => (await s.client.listWorkers()).find((w) => w.pid === stale.pid)?.id,
      "the worker process to be live",
    );
    const { job } = await s.client.submit({ agent: "ticker" });
    await startedAttempt(s.client, job.id, 1);
    await eventually(async () => ((await stampsIn(stamps)).some((t) => t.what === "tick") ? true : undefined), "attempt 1 to tick");

    stale.kill("SIGSTOP"); // frozen: it neither renews its lease nor stops its agent
    // The agent runs on for now: the check below can fail.
    expect(agentProcesses(mark).filter((p) => p.attempt === 1).length).toBeGreaterThan(0);
    await using fresh = createWorker({ ...s.nats.workerRole, providers: [createHostSandboxProvider()] });
    void fresh.run();

    const { goneAt, start2, ticks1 } = await watchHandover(mark, stamps);
    expect(start2, "attempt 2 to start on the other worker").toBeDefined();
    const lastTick = Math.max(...ticks1.map((t) => t.at));
    // Attempt 1's agent stopped ticking, and left the process table, before attempt 2 started.
    expect(lastTick, "attempt 1's last tick comes before attempt 2's start").toBeLessThan(start2?.at as number);
    expect(goneAt, "attempt 1's agent gone while its worker is frozen").toBeDefined();
    expect(goneAt as number, "attempt 1's agent gone before attempt 2 started").toBeLessThanOrEqual(start2?.at as number);

    // Woken up while attempt 2 runs: its attempt is over and another owns the job.
    stale.kill("SIGCONT");
    const wokeAt = Date.now();
    const final = await s.client.waitForJob(job.id);
    expect(final).toMatchObject({ state: "succeeded", attempt: 2, workerId: fresh.id, result: { output: "attempt 2" } });
    // The woken worker is running again (it heartbeats), and has had time to act on its attempt.
    await eventually(async () => {
      const entry = (await s.client.listWorkers()).find((w) => w.id === staleId);
      return entry && Date.parse(entry.heartbeatAt) > wokeAt ? true : undefined;
    }, "the woken worker to heartbeat");
    await sleep(LEASE_MS);

    expect(await s.client.getJob(job.id)).toEqual(final);
    const events = await jobEvents(s.client, job.id);
    expect(outcomesOf(events)).toEqual(["succeeded:2"]);
    // Attempt 1 (the woken worker's) has its start and nothing else: no outcome, no requeue, no retry.
    expect(typesOf(events.filter((e) => e.attempt === 1))).toEqual(["started:1"]);
    expect(typesOf(events.filter((e) => e.workerId === staleId))).toEqual(["started:1"]);
    // Nor was the work item handed back: no third attempt, nothing left in the work stream.
    expect(events.some((e) => e.attempt > 2)).toBe(false);
    const work = await s.nats.topology.jsm.streams.info(s.nats.topology.names.streams.work);
    expect(work.state.messages).toBe(0);
    // Attempt 1 ran until it was stopped, once; attempt 2 once.
    const all = await stampsIn(stamps);
    expect(all.filter((t) => t.what === "start").map((t) => t.attempt)).toEqual([1, 2]);
    expect(all.filter((t) => t.what === "tick").every((t) => t.at <= lastTick)).toBe(true);
    expect(agentProcesses(mark)).toEqual([]);
  } finally {
    stale.kill("SIGCONT");
    stale.kill("SIGKILL");
    await exited(stale);
    killAgents(mark);
  }
});

test("host: a concurrency limit of 2 per key holds through a SIGKILLed worker: never more than 2 agents alive at once", async () => {
  await using s = await system();
  await using dir = await scratch("boxcar-one-attempt-");
  const stamps = join(dir.path, "stamps.txt");
  const mark = newMark();
  await s.client.applyAgent({
    name: "limited",
    command: [stamp("start"), "sleep 6", stamp("stop")].join("\n"),
    trusted: true,
    runtime: { sandbox: "host" },
    env: { [MARK]: mark, STAMPS: stamps },
    concurrency: { limit: 2, key: "input.customer" },
  });
  const workers = [0, 1].map(() => spawnBoxcar(s.nats.url, s.prefix, ["worker", "--concurrency", "2"]));
  // Every 50 ms: which agents (job:attempt) have a process alive, when each was first and last seen.
  const samples: { at: number; alive: Set<string> }[] = [];
  const firstGone = new Map<string, number>();
  const lastSeen = new Map<string, number>();
  let polling = true;
  const poller = (async () => {
    const seen = new Set<string>();
    while (polling) {
      const at = Date.now();
      const alive = new Set(agentProcesses(mark).map((p) => `${p.job}:${p.attempt}`));
      samples.push({ at, alive });
      for (const a of alive) {
        seen.add(a);
        lastSeen.set(a, at);
      }
      for (const a of seen) if (!alive.has(a) && !firstGone.has(a)) firstGone.set(a, at);
      await sleep(50);
    }
  })();
  try {
    await eventually(async () => ((await s.client.listWorkers()).length === 2 ? true : undefined), "two live workers");
    const jobs: JobRecord[] = [];
    for (let i = 0; i < 6; i++) jobs.push((await s.client.submit({ agent: "limited", input: { customer: "c1", i } })).job);

    // Two agents run; the worker with the most of them is killed, early in their 6 s.
    const running = await eventually(async () => {
      const found = agentProcesses(mark).filter((p) => p.cmd === "sleep 6");
      return found.length === 2 ? found : undefined;
    }, "two agents to run");
    const holds = (w: (typeof workers)[number]) => running.filter((p) => descendsFrom(p.pid, w.pid as number)).length;
    const doomed = [...workers].sort((a, b) => holds(b) - holds(a))[0] as (typeof workers)[number];
    expect(holds(doomed)).toBeGreaterThanOrEqual(1);
    doomed.kill("SIGKILL");
    await exited(doomed);

    const done = await Promise.all(jobs.map((j) => s.client.waitForJob(j.id, AbortSignal.timeout(60_000))));
    await sleep(200);
    polling = false;
    await poller;
    expect(done.map((j) => j.state)).toEqual(Array(6).fill("succeeded"));
    // The killed worker's jobs ran again.
    expect(done.filter((j) => j.attempt > 1).length).toBeGreaterThanOrEqual(1);

    // From the agents' own stamps: each agent from its start to its stop, or, for one killed
    // (no stop stamp), to the last sample after its start that saw its processes alive. (It died
    // between that sample and the next, which on a loaded machine can come long after: the first
    // sample to find it gone once made a killed agent outlive its death by the poller's stall.)
    // One killed before any sample after its start saw it ends at the first sample after its
    // start, which found it gone. The process table's own count below is the check of the
    // moments between.
    const all = await stampsIn(stamps);
    const stops = new Map(all.filter((t) => t.what === "stop").map((t) => [`${t.job}:${t.attempt}`, t.at]));
    const killedAt = (key: string, from: number) => {
      const seen = lastSeen.get(key);
      if (seen !== undefined && seen >= from) return seen;
      return samples.find((sm) => sm.at >= from && !sm.alive.has(key))?.at ?? Number.POSITIVE_INFINITY;
    };
    const spans = all
      .filter((t) => t.what === "start")
      .map((t) => {
        const key = `${t.job}:${t.attempt}`;
        return { key, from: t.at, to: stops.get(key) ?? killedAt(key, t.at) };
      });
    const gaps = samples.slice(1).map((sm, i) => sm.at - (samples[i] as { at: number }).at);
    const described = () =>
      `${spans.map((sp) => `${sp.key} ${sp.from}-${sp.to}${stops.has(sp.key) ? "" : ` (killed: seen ${lastSeen.get(sp.key)}, gone ${firstGone.get(sp.key)})`}`).join("; ")}; longest gap between samples ${Math.max(...gaps)} ms`;
    expect(spans.length).toBeGreaterThanOrEqual(7);
    const edges = spans.flatMap((sp) => [
      { at: sp.from, d: 1, key: sp.key },
      { at: sp.to, d: -1, key: sp.key },
    ]);
    edges.sort((a, b) => a.at - b.at || a.d - b.d);
    let now = 0;
    let most = 0;
    let worst: string[] = [];
    const open = new Set<string>();
    for (const e of edges) {
      now += e.d;
      if (e.d > 0) open.add(e.key);
      else open.delete(e.key);
      if (now > most) {
        most = now;
        worst = [...open];
      }
    }
    expect(most, `agents alive at once by their stamps (at worst: ${worst.join(", ")}; ${described()})`).toBeLessThanOrEqual(2);
    // And as the process table showed them.
    const crowded = samples.filter((sm) => sm.alive.size > 2).map((sm) => [...sm.alive]);
    expect(crowded[0] ?? [], "agents alive at once in the process table").toEqual([]);
    expect(Math.max(...samples.map((sm) => sm.alive.size))).toBe(2);
  } finally {
    polling = false;
    await poller;
    for (const w of workers) w.kill("SIGKILL");
    for (const w of workers) await exited(w);
    killAgents(mark);
  }
}, 90_000);

test("host: a worker cut off from NATS loses its agent before the job starts on another worker; the job ends once", async () => {
  await using s = await system();
  await using proxy = await tcpProxy(s.nats.url);
  await using dir = await scratch("boxcar-one-attempt-");
  const stamps = join(dir.path, "stamps.txt");
  const mark = newMark();
  await s.client.applyAgent({
    name: "ticker",
    command: tickingAgent(500),
    trusted: true,
    runtime: { sandbox: "host" },
    env: { [MARK]: mark, STAMPS: stamps },
  });
  // The worker process reaches NATS only through the proxy.
  const cut = spawnBoxcar(proxy.url, s.prefix, ["worker"], workerCredentials(s.nats));
  try {
    await eventually(
      async () => ((await s.client.listWorkers()).some((w) => w.pid === cut.pid) ? true : undefined),
      "the worker process to be live",
    );
    expect(proxy.accepted).toBeGreaterThanOrEqual(1);
    const { job } = await s.client.submit({ agent: "ticker" });
    await startedAttempt(s.client, job.id, 1);
    await eventually(async () => ((await stampsIn(stamps)).some((t) => t.what === "tick") ? true : undefined), "attempt 1 to tick");
    await using other = createWorker({ ...s.nats.workerRole, providers: [createHostSandboxProvider()] });
    void other.run();

    proxy.blackhole();
    // The partitioned worker's agent runs on for now: the check below can fail.
    expect(agentProcesses(mark).filter((p) => p.attempt === 1).length).toBeGreaterThan(0);

    const { goneAt, start2, ticks1 } = await watchHandover(mark, stamps);
    expect(start2, "attempt 2 to start on the other worker").toBeDefined();
    const lastTick = Math.max(...ticks1.map((t) => t.at));
    expect(lastTick, "attempt 1's last tick comes before attempt 2's start").toBeLessThan(start2?.at as number);
    expect(goneAt, "attempt 1's agent gone while its worker is cut off").toBeDefined();
    expect(goneAt as number, "attempt 1's agent gone before attempt 2 started").toBeLessThanOrEqual(start2?.at as number);

    const final = await s.client.waitForJob(job.id);
    expect(final).toMatchObject({ state: "succeeded", attempt: 2, workerId: other.id, result: { output: "attempt 2" } });
    const events = await jobEvents(s.client, job.id);
    expect(outcomesOf(events)).toEqual(["succeeded:2"]);
    expect(typesOf(events.filter((e) => e.attempt === 1))).toEqual(["started:1"]);
    expect((await stampsIn(stamps)).filter((t) => t.what === "start").map((t) => t.attempt)).toEqual([1, 2]);
  } finally {
    cut.kill("SIGKILL");
    await exited(cut);
    killAgents(mark);
  }
});

const dockerOk = await dockerReady();

describe.skipIf(!dockerOk)("Docker: a worker SIGKILLed mid-job leaves no running container of the job within 2 s", () => {
  const cases = [
    { kind: "cold", flags: [] as string[] },
    { kind: "warm", flags: ["--docker-warm", "1"] },
  ];
  test.each(cases)(
    "$kind container",
    async ({ kind, flags }) => {
      await using s = await system();
      const warm = kind === "warm";
      await s.client.applyAgent({
        name: `boxed-${kind}`,
        command: ["sh", "-c", "echo up; sleep 300"],
        runtime: { sandbox: "docker", timeout: "5m", ...(warm ? { warm: true } : {}) },
      });
      const worker = spawnBoxcar(s.nats.url, s.prefix, ["worker", "--sandboxes", "docker", "--heartbeat", "500ms", ...flags]);
      try {
        // A warm container stands ready before the job comes, so the job takes it.
        await eventually(
          async () =>
            (await s.client.listWorkers()).some((w) => w.pid === worker.pid && (!warm || (w.warm ?? 0) >= 1)) ? true : undefined,
          warm ? "the worker's warm container to be ready" : "the worker process to be live",
          60_000,
        );
        const { job } = await s.client.submit({ agent: `boxed-${kind}` });
        await startedAttempt(s.client, job.id, 1);
        const running = await eventually(async () => {
          const found = (await boxcarContainers(s.prefix, job.id)).filter((c) => c.State === "running");
          return found.length > 0 ? found : undefined;
        }, "the job's container to run");
        if (warm) expect(running.map((c) => c.Labels["boxcar.warm"])).toEqual(["1"]);
        else expect(running.map((c) => c.Labels["boxcar.job"])).toEqual([job.id]);
        // The agent runs in it (a warm container is labelled as the job's before its script is
        // read: on a loaded machine the agent may start a moment after its container shows up).
        await eventually(async () => {
          const top: { Processes?: string[][] } = await new Docker().getContainer(running[0]?.Id as string).top();
          return top.Processes?.some((p) => p.join(" ").includes("sleep 300")) ? true : undefined;
        }, "the agent to run in the job's container");

        worker.kill("SIGKILL");
        const killedAt = Date.now();
        await exited(worker);
        let left = running;
        while (left.length > 0 && Date.now() < killedAt + 2_000) {
          await sleep(50);
          left = (await boxcarContainers(s.prefix, job.id)).filter((c) => c.State === "running");
        }
        expect(
          left.map((c) => `${c.Names.join(",")} ${c.Status}`),
          "the job's containers still running 2 s after its worker was SIGKILLed",
        ).toEqual([]);
      } finally {
        worker.kill("SIGKILL");
        await exited(worker);
        await removeContainers(s.prefix);
      }
    },
    90_000,
  );
});

describe.skipIf(!dockerOk)("Docker: an agent at its pids limit", () => {
  test("attack: a fork bomb that holds every process its pids limit allows cannot stop its lifeline: it runs on while beats come, and is gone by its stop time once its worker freezes", async () => {
    await using s = await system();
    await s.client.applyAgent({
      name: "pid-hog",
      // A sentinel that forked for each beat was refused its fork once the bomb held every process:
      // it killed the agent, or died and left it to outlive its worker (lifeline.ts).
      // It forks without pause, so each process freed (the sentinel's own, as a beat ends) is taken at once.
      command: ["perl", "-e", "while (1) { my $p = fork; if (defined $p && $p == 0) { sleep 300; exit } }"],
      runtime: { sandbox: "docker", timeout: "5m", limits: { pids: 16, cpus: 0.5 } },
    });
    const worker = spawnBoxcar(s.nats.url, s.prefix, ["worker", "--sandboxes", "docker", "--heartbeat", "500ms"]);
    try {
      await eventually(
        async () => ((await s.client.listWorkers()).some((w) => w.pid === worker.pid) ? true : undefined),
        "the worker",
        60_000,
      );
      const { job } = await s.client.submit({ agent: "pid-hog" });
      const running = async () => {
        const record = await s.client.getJob(job.id);
        if (isTerminal(record.state)) throw new Error(`the job ended while its bomb held its processes: ${JSON.stringify(record.error)}`);
        const [found] = (await boxcarContainers(s.prefix, job.id)).filter((c) => c.State === "running");
        return found && new Docker().getContainer(found.Id);
      };
      const container = await eventually(async () => {
        const found = await running();
        const stats = found && ((await found.stats({ stream: false })) as { pids_stats?: { current?: number } });
        return (stats?.pids_stats?.current ?? 0) >= 16 ? found : undefined;
      }, "the bomb to hold every process the limit allows");
      // Three beats (a third of the lease apart) while it holds them: the job and its container run on.
      await sleep(LEASE_MS);
      expect(await running(), "the job's container after three beats").toBeDefined();

      worker.kill("SIGSTOP"); // frozen: no more beats, nor anything from the worker
      const frozenAt = Date.now();
      // Its stop time is at most 5/6 of the lease after the last renewal, which came before the freeze.
      let up = true;
      while (up && Date.now() < frozenAt + (LEASE_MS * 5) / 6 + 1_000) {
        await sleep(100);
        up = (await container.inspect()).State.Running;
      }
      expect(up, `the agent's container running ${Date.now() - frozenAt} ms after its worker froze`).toBe(false);
    } finally {
      worker.kill("SIGCONT");
      worker.kill("SIGKILL");
      await exited(worker);
      await removeContainers(s.prefix);
    }
  }, 90_000);
});

/** Removes every container of the system, twice: a container the engine was still making when its worker died shows up late. */
async function removeContainers(prefix: string): Promise<void> {
  const docker = new Docker();
  for (const pause of [0, 1_000]) {
    await sleep(pause);
    const left = await boxcarContainers(prefix);
    await Promise.all(
      left.map((c) =>
        docker
          .getContainer(c.Id)
          .remove({ force: true, v: true })
          .catch(() => {}),
      ),
    );
  }
}
