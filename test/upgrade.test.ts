import { readFile, writeFile } from "node:fs/promises";
import { join } from "node:path";
import { connectNats, createClient, resolveConnection } from "@boxcar/client";
import { freePort, startNatsServer } from "@boxcar/fabric";
import { isTerminal, type JobRecord, names } from "@boxcar/protocol";
import { eventually, scratch, uniquePrefix } from "@boxcar/testing";
import { expect, test } from "vitest";
import { BOXCAR_BIN, boxcar, exited, spawnBoxcar } from "./helpers/cli.js";
import { releaseBin } from "./helpers/release.js";

/**
 * The last commit before issue 13 and issue 19 changed what is stored (one writer of job
 * records, folded events, one revision per record, retention). A system it created must keep
 * its jobs, agents and artifacts across a rolling upgrade to this build.
 */
const RELEASE = "46296fa26c9b92317404ebdfe5309ab0e3c85981";
const release = await releaseBin(RELEASE).catch((err: Error) => ({ missing: `it could not be built: ${err.message}` }));
if ("missing" in release) process.stderr.write(`\n!!! SKIPPING THE UPGRADE TEST: the release ${RELEASE.slice(0, 7)}: ${release.missing}\n`);

const OLD_JOBS = 16;
const NEW_JOBS = 6;

/** Sleeps, keeps a file naming its job, and answers its input. */
const AGENT = `name: upgrade-echo
command: 'sleep 3; echo "$BOXCAR_JOB_ID" > "$BOXCAR_OUTPUT_DIR/id.txt"; printf "{\\"output\\":%s}" "$(cat "$BOXCAR_INPUT_FILE")" > "$BOXCAR_RESULT_FILE"'
outputs: ["out/*"]
trusted: true
runtime: { sandbox: host }
`;

/** Two steps, the second fed by the first: a run the previous release starts and this one finishes. */
const WORKFLOW = `name: upgrade-pair
steps:
  - name: first
    agent: upgrade-echo
    input: "{{ input }}"
  - name: second
    agent: upgrade-echo
    needs: [first]
    input: "{{ steps.first.output }}"
`;

test.skipIf("missing" in release)(
  "a system the previous release made keeps its queued and running jobs, agents and artifacts across a rolling upgrade; every job ends once",
  async () => {
    const oldBin = (release as { bin: string }).bin;
    await using dir = await scratch("boxcar-upgrade-");
    const prefix = uniquePrefix();
    const port = await freePort();
    const url = `nats://127.0.0.1:${port}`;
    const authDir = join(dir.path, "auth");

    // The previous release sets the system up: its credentials, its server config, its roles.
    const init = await boxcar(url, prefix, ["auth", "init", authDir, "--listen", `127.0.0.1:${port}`], {}, oldBin);
    expect(init.code, init.stderr).toBe(0);
    await using _server = await startNatsServer({
      port,
      storeDir: join(dir.path, "store"),
      extraConfig: await readFile(join(authDir, "auth.conf"), "utf8"),
    });
    const as = (role: string): NodeJS.ProcessEnv => ({
      NATS_CREDS: join(authDir, `${role}.creds`),
      ...(role === "worker" ? { BOXCAR_DISPATCHER_KEYS: join(authDir, "dispatchers.pub") } : {}),
    });
    const roles: ReturnType<typeof spawnBoxcar>[] = [];
    const start = (role: "dispatcher" | "worker", bin: string, ...args: string[]) => {
      const child = spawnBoxcar(url, prefix, [role, ...args], as(role), bin);
      roles.push(child);
      return child;
    };
    const stop = async (child: ReturnType<typeof spawnBoxcar>) => {
      child.kill("SIGTERM");
      return exited(child);
    };
    const cli = async (bin: string, ...args: string[]) => {
      const r = await boxcar(url, prefix, [...args, "--json"], as("admin"), bin);
      expect(r.code, `${args.join(" ")}: ${r.stderr}`).toBe(0);
      return JSON.parse(r.stdout) as unknown;
    };

    const nc = await connectNats(resolveConnection({ flags: { nats: url, creds: join(authDir, "admin.creds") }, env: {} }), "upgrade-test");
    try {
      const oldDispatcher = start("dispatcher", oldBin);
      const oldWorker = start("worker", oldBin, "--concurrency", "1", "--drain-grace", "30s");
      const agentFile = join(dir.path, "agent.yaml");
      await writeFile(agentFile, AGENT);
      await eventually(
        async () => ((await boxcar(url, prefix, ["agent", "apply", "-f", agentFile], as("admin"), oldBin)).code === 0 ? true : undefined),
        "the old dispatcher to take the agent",
      );
      const ids: string[] = [];
      const submit = async (bin: string, i: number) => {
        const reply = (await cli(bin, "submit", "upgrade-echo", "--input", String(i))) as { job?: JobRecord; id?: string };
        ids.push(reply.job?.id ?? (reply.id as string));
      };
      for (let i = 0; i < OLD_JOBS; i++) await submit(oldBin, i);
      // A run whose steps queue behind those jobs.
      const workflowFile = join(dir.path, "workflow.yaml");
      await writeFile(workflowFile, WORKFLOW);
      const started = (await cli(oldBin, "run", workflowFile, "--input", "77")) as { run?: { id: string }; id?: string };
      const runId = started.run?.id ?? (started.id as string);
      const client = createClient({ nc, names: names(prefix) });
      const states = () => Promise.all(ids.map(async (id) => (await client.getJob(id).catch((e: Error) => ({ state: e.message })))?.state));
      const describe = async () => {
        process.stderr.write(`upgrade: job states ${JSON.stringify(await states())}\n`);
        for (const r of roles) process.stderr.write(`--- ${r.spawnargs.slice(1, 3).join(" ")}\n${r.output().slice(-4000)}\n`);
      };
      // Some ran under the old release, many still wait: its worker has one slot and each job
      // takes 3 s, so the swap below (several CLI processes on a loaded machine) ends long
      // before the old worker could run them all.
      await eventually(
        async () => {
          const now = await states();
          return now.includes("succeeded") && now.filter((s) => s === "queued").length >= OLD_JOBS / 2 ? true : undefined;
        },
        "an old job done and half of them queued",
        30_000,
      ).catch(async (err) => {
        await describe();
        throw err;
      });

      const ranByOld = new Set((await Promise.all(ids.map((id) => client.getJob(id)))).map((j) => j.workerId).filter(Boolean));
      expect(ranByOld.size).toBe(1);

      // The upgrade, as docs/deploy.md says: the account's permissions, then the dispatchers, then the workers.
      const push = await boxcar(url, prefix, ["auth", "push", "--dir", authDir], as("admin"));
      expect(push.code, push.stderr).toBe(0);
      const newDispatcher = start("dispatcher", BOXCAR_BIN);
      // Its own log, not an answer to the API: the old dispatcher, still running, answers too (a
      // CI run stopped the old one while the new one was still starting).
      await eventually(
        async () => (newDispatcher.output().includes("dispatcher started") ? true : undefined),
        "the new dispatcher to start",
      );
      expect(await stop(oldDispatcher)).toEqual({ code: 0, signal: null });
      const newWorker = start("worker", BOXCAR_BIN, "--concurrency", "4");
      expect(await stop(oldWorker)).toEqual({ code: 0, signal: null });
      for (let i = OLD_JOBS; i < OLD_JOBS + NEW_JOBS; i++) await submit(BOXCAR_BIN, i);

      const finals = await eventually(
        async () => {
          const records = await Promise.all(ids.map((id) => client.getJob(id).catch(() => undefined)));
          return records.every((r) => r && isTerminal(r.state)) ? (records as JobRecord[]) : undefined;
        },
        `all ${ids.length} jobs to end`,
        120_000,
      ).catch(async (err) => {
        await describe();
        throw err;
      });
      for (const [i, job] of finals.entries()) {
        expect([job.id, job.state, job.result?.output]).toEqual([ids[i], "succeeded", i]);
        // Its file, made by whichever release ran it, is there to download.
        expect(job.artifacts.map((a) => a.path)).toEqual(["out/id.txt"]);
        const outcomes: string[] = [];
        for await (const e of client.events(job.id)) if (e.kind === "job" && isTerminal(e.state)) outcomes.push(`${e.type}:${e.attempt}`);
        expect(outcomes, job.id).toEqual([`succeeded:${job.attempt}`]);
      }
      // The run the previous release started ended here, its second step admitted by this release.
      const run = await eventually(async () => {
        const r = await client.getRun(runId).catch(() => undefined);
        return r && (r.state === "succeeded" || r.state === "failed" || r.state === "cancelled") ? r : undefined;
      }, "the workflow run to end");
      expect([run.state, run.output]).toEqual(["succeeded", 77]);
      // Jobs the previous release admitted and queued ran on this release's worker.
      const carriedOver = finals.slice(0, OLD_JOBS).filter((j) => !ranByOld.has(j.workerId));
      expect(carriedOver.length).toBeGreaterThan(0);
      process.stdout.write(
        `upgrade: ${OLD_JOBS} jobs submitted to ${RELEASE.slice(0, 7)}, ${carriedOver.length} of them run after the upgrade; ${NEW_JOBS} more after it; each ended once\n`,
      );
      // The first job's file, stored by the previous release, downloads through this one.
      const written = await client.downloadArtifacts(finals[0]!.id, join(dir.path, "download"));
      expect(written).toHaveLength(1);
      expect((await readFile(written[0]!, "utf8")).trim()).toBe(finals[0]!.id);
      await stop(newWorker);
      await stop(newDispatcher);
    } finally {
      for (const child of roles) child.kill("SIGKILL");
      await nc.close();
    }
  },
  240_000,
);
