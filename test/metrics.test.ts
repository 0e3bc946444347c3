import { readFile } from "node:fs/promises";
import { createClient } from "@boxcar/client";
import { dockerReady, eventually, natsFixture } from "@boxcar/testing";
import { expect, test } from "vitest";
import { parse } from "yaml";
import { boxcar, exited, spawnBoxcar } from "./helpers/cli.js";
import { probe, type RoleProcess } from "./helpers/health.js";

/** The metrics endpoint a role logged it listens on (it was given port 0). */
async function metricsOf(role: RoleProcess): Promise<string> {
  const address = await eventually(
    async () => /"metrics":"([^"]+)"[^\n]*metrics endpoint listening/.exec(role.output())?.[1],
    "the metrics endpoint to listen",
  );
  return `http://${address}`;
}

/** One scrape: each sample's value by its name and labels as written (`name{a="x"}`), and each metric's type. */
async function scrape(base: string): Promise<{ samples: Map<string, number>; types: Map<string, string> }> {
  const res = await fetch(`${base}/metrics`);
  expect(res.status).toBe(200);
  expect(res.headers.get("content-type")).toContain("text/plain");
  const samples = new Map<string, number>();
  const types = new Map<string, string>();
  for (const line of (await res.text()).split("\n")) {
    const type = /^# TYPE (\S+) (\S+)$/.exec(line);
    if (type) types.set(type[1] as string, type[2] as string);
    else if (line && !line.startsWith("#")) {
      const at = line.lastIndexOf(" ");
      samples.set(line.slice(0, at), Number(line.slice(at + 1)));
    }
  }
  return { samples, types };
}

const docker = await dockerReady();

test("a dispatcher and a worker serve Prometheus metrics that move with real jobs, with no job ids in them", async () => {
  await using nats = await natsFixture();
  const prefix = nats.topology.names.prefix;
  const roles: RoleProcess[] = [];
  try {
    const dispatcher = spawnBoxcar(nats.url, prefix, ["dispatcher", "--metrics", "127.0.0.1:0"]);
    const worker = spawnBoxcar(nats.url, prefix, ["worker", "--host", "always", "--concurrency", "3"], { BOXCAR_METRICS: "127.0.0.1:0" });
    roles.push(dispatcher, worker);
    const [atDispatcher, atWorker] = await Promise.all([metricsOf(dispatcher), metricsOf(worker)]);

    const client = createClient(nats.topology);
    await eventually(async () => ((await client.listAgents().catch(() => undefined)) ? true : undefined), "the dispatcher to answer");
    await client.applyAgent({ name: "ok", command: "echo hello > out/a.txt", trusted: true, runtime: { sandbox: "host" } });
    await client.applyAgent({ name: "bad", command: "exit 2", trusted: true, runtime: { sandbox: "host" } });
    await client.applyAgent({ name: "idle", command: "true", trusted: true, pool: "nobody", runtime: { sandbox: "host" } });
    const ids: string[] = [];
    for (let i = 0; i < 3; i++) ids.push((await client.submit({ agent: "ok" })).job.id);
    ids.push((await client.submit({ agent: "bad" })).job.id);
    if (docker) {
      // The engine samples usage about once a second: the sleep lets a sample after the work be taken.
      await client.applyAgent({
        name: "busy",
        command: "head -c 50000000 /dev/urandom | sha256sum; sleep 2",
        runtime: { sandbox: "docker" },
      });
      ids.push((await client.submit({ agent: "busy" })).job.id);
    }
    for (const id of ids) await client.waitForJob(id);
    const waiting = await client.submit({ agent: "idle" });
    ids.push(waiting.job.id);
    await expect(client.submit({ agent: "ghost" })).rejects.toMatchObject({ code: "unknown_agent" });

    const d = await scrape(atDispatcher);
    expect(d.samples.get('boxcar_jobs_admitted_total{agent="ok",pool="default"}')).toBe(3);
    expect(d.samples.get('boxcar_jobs_admitted_total{agent="bad",pool="default"}')).toBe(1);
    expect(d.samples.get('boxcar_admissions_refused_total{code="unknown_agent"}')).toBe(1);
    expect(d.samples.get('boxcar_queue_depth{pool="nobody",priority="normal"}')).toBe(1);
    expect(d.samples.get('boxcar_queue_depth{pool="default",priority="normal"}')).toBe(0);
    await eventually(async () => {
      const now = await scrape(atDispatcher);
      return now.samples.get('boxcar_jobs{state="succeeded"}') === (docker ? 4 : 3) && now.samples.get('boxcar_jobs{state="failed"}') === 1
        ? true
        : undefined;
    }, "the jobs gauge to count the ended jobs");
    expect(d.types.get("boxcar_jobs_admitted_total")).toBe("counter");
    expect(d.types.get("boxcar_queue_depth")).toBe("gauge");
    expect(d.types.get("process_cpu_seconds_total")).toBe("counter");

    const w = await scrape(atWorker);
    expect(w.samples.get('boxcar_worker_attempts_total{agent="ok",pool="default",outcome="succeeded"}')).toBe(3);
    expect(w.samples.get('boxcar_worker_attempts_total{agent="bad",pool="default",outcome="failed"}')).toBe(1);
    expect(w.samples.get('boxcar_worker_attempt_seconds_count{agent="ok",pool="default",outcome="succeeded"}')).toBe(3);
    expect(w.samples.get('boxcar_worker_attempt_seconds_count{agent="bad",pool="default",outcome="failed"}')).toBe(1);
    // From submit to end, by final state.
    expect(w.samples.get('boxcar_job_duration_seconds_count{agent="ok",outcome="succeeded"}')).toBe(3);
    expect(w.samples.get('boxcar_job_duration_seconds_count{agent="bad",outcome="failed"}')).toBe(1);
    expect(w.types.get("boxcar_job_duration_seconds")).toBe("histogram");
    expect(w.samples.get('boxcar_worker_queue_wait_seconds_count{pool="default"}')).toBe(docker ? 5 : 4);
    expect(w.samples.get('boxcar_sandbox_create_seconds_count{kind="host"}')).toBe(4);
    expect(w.samples.get('boxcar_worker_artifact_bytes_total{agent="ok"}')).toBe(3 * "hello\n".length);
    if (docker) {
      expect(w.samples.get('boxcar_sandbox_create_seconds_count{kind="docker"}')).toBe(1);
      expect(w.samples.get('boxcar_sandbox_starts_total{kind="docker",start="cold"}')).toBe(1);
      expect(w.samples.get('boxcar_worker_agent_cpu_seconds_total{agent="busy"}')).toBeGreaterThan(0.05);
    } else process.stderr.write("metrics.test.ts: no Docker engine; the CPU-per-agent metric was not checked\n");
    expect(w.samples.get("boxcar_worker_slots")).toBe(3);
    expect(w.samples.get("boxcar_worker_warm_sandboxes")).toBe(0); // no warm pool configured
    expect(w.samples.get("boxcar_worker_jobs_running")).toBe(0);
    expect(w.types.get("boxcar_worker_attempt_seconds")).toBe("histogram");

    // A workflow run whose second step fails: the runs gauge counts it, its steps' jobs are admitted.
    const { run } = await client.startRun({
      workflow: {
        name: "pair",
        steps: [
          { name: "a", agent: "ok" },
          { name: "b", agent: "bad", needs: ["a"] },
        ],
      },
    });
    expect((await client.waitForRun(run.id)).state).toBe("failed");
    ids.push(run.id);
    const afterRun = await eventually(async () => {
      const now = await scrape(atDispatcher);
      return now.samples.get('boxcar_workflow_runs{state="failed"}') === 1 ? now : undefined;
    }, "the runs gauge to count the failed run");
    expect(afterRun.samples.get('boxcar_jobs_admitted_total{agent="bad",pool="default"}')).toBe(2);
    expect(afterRun.types.get("boxcar_workflow_runs")).toBe("gauge");

    // What the dispatcher does to jobs besides admitting them: a cancel and a retry through the
    // API, and a job that waited past its queue timeout on a pool no worker serves.
    await client.cancelJob(waiting.job.id);
    await client.applyAgent({
      name: "doomed",
      command: "exit 3",
      trusted: true,
      runtime: { sandbox: "host" },
      retry: { maxAttempts: 2, delay: "0s", jitter: false },
    });
    const doomed = await client.submit({ agent: "doomed" });
    ids.push(doomed.job.id);
    expect((await client.waitForJob(doomed.job.id)).state).toBe("dead");
    await client.retryJob(doomed.job.id);
    const late = await client.submit({ agent: "idle", queueTimeout: "200ms" });
    ids.push(late.job.id);
    expect((await client.waitForJob(late.job.id)).state).toBe("expired");
    const actions = await eventually(async () => {
      const now = await scrape(atDispatcher);
      return now.samples.get('boxcar_dispatcher_job_actions_total{action="expire",agent="idle"}') === 1 ? now : undefined;
    }, "the expiry to be counted");
    expect(actions.samples.get('boxcar_dispatcher_job_actions_total{action="cancel",agent="idle"}')).toBe(1);
    expect(actions.samples.get('boxcar_dispatcher_job_actions_total{action="retry",agent="doomed"}')).toBe(1);
    expect(actions.types.get("boxcar_dispatcher_job_actions_total")).toBe("counter");

    // The alert rules and the dashboard under deploy/ ask only for metrics the roles export.
    const exported = new Set([...d.types.keys(), ...w.types.keys()]);
    const rules = parse(await readFile(new URL("../deploy/prometheus/boxcar-alerts.yaml", import.meta.url), "utf8")) as {
      groups: { rules: { alert: string; expr: string; for: string; labels: { severity: string }; annotations: { summary: string } }[] }[];
    };
    const dashboard = JSON.parse(await readFile(new URL("../deploy/grafana/boxcar-dashboard.json", import.meta.url), "utf8")) as {
      panels: { targets: { expr: string }[] }[];
    };
    const exprs = [
      ...rules.groups.flatMap((g) => g.rules.map((r) => r.expr)),
      ...dashboard.panels.flatMap((p) => p.targets.map((t) => t.expr)),
    ];
    for (const rule of rules.groups.flatMap((g) => g.rules)) {
      expect([rule.alert, rule.for, rule.labels.severity, rule.annotations.summary].every(Boolean), rule.alert).toBe(true);
    }
    const asked = new Set(exprs.flatMap((e) => e.match(/\bboxcar_[a-z_]+/g) ?? []).map((m) => m.replace(/_(bucket|count|sum)$/, "")));
    expect([...asked].filter((name) => !exported.has(name))).toEqual([]);
    expect(asked.size).toBeGreaterThan(8);

    // Bounded labels: no job id anywhere in either scrape.
    for (const base of [atDispatcher, atWorker]) {
      const text = await (await fetch(`${base}/metrics`)).text();
      for (const id of ids) expect(text).not.toContain(id);
      expect((await probe(base, "/healthz")).status).toBe(404);
      expect((await probe(base, "/metrics", "POST")).status).toBe(405);
    }
  } finally {
    for (const role of roles) role.kill("SIGKILL");
    await Promise.all(roles.map(exited));
  }
}, 90_000);

test("a --metrics that is not HOST:PORT is a usage error naming where it came from", async () => {
  await using nats = await natsFixture();
  for (const [args, env, named] of [
    [["worker", "--metrics", "9464"], {}, "--metrics"],
    [["dispatcher"], { BOXCAR_METRICS: "nowhere" }, "BOXCAR_METRICS"],
  ] as const) {
    const r = await boxcar(nats.url, nats.topology.names.prefix, [...args], env);
    expect(r.code, r.stderr).toBe(2);
    expect(r.stderr).toContain(named);
  }
});
