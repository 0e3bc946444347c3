import { join } from "node:path";
import { AuthDir } from "@boxcar/auth";
import { PRIORITIES, type Priority } from "@boxcar/protocol";
import { eventually, type Scratch, scratch } from "@boxcar/testing";
import { afterAll, beforeAll, expect, test } from "vitest";
import { KedaJetStreamScaler, type KedaRelease, kedaYamlTriggers } from "./helpers/keda-scaler.js";
import { type BoxcarRoles, boxcarRoles, type MonitoredServers, monitoredServers } from "./helpers/monitored-servers.js";

/**
 * The signal deploy/kubernetes/overlays/ha/keda.yaml scales workers on, as KEDA reads it:
 * KEDA's nats-jetstream scaler, ported from its source with its requests, account match and leader
 * lookup unchanged (helpers/keda-scaler.ts), polls each of the file's triggers against a real
 * three-server cluster that runs the config `boxcar auth init` writes (operator mode), with
 * `account` the Boxcar account's public key. The servers listen on 127.0.0.2-4 with one monitoring
 * port, as the scaler needs to tell them apart (helpers/monitored-servers.ts). KEDA 2.16 (as every
 * release from 2.12, which matches the account by `name` only) and 2.20 (which also matches `id`)
 * must read the same lag. Without authentication, where an account's name and id agree, this test
 * could not see that KEDA 2.12-2.16 read nothing when the account was named otherwise
 * (test/keda-auth.test.ts).
 */

let dir: Scratch;
let auth: AuthDir;
let servers: MonitoredServers;
let roles: BoxcarRoles;
beforeAll(async () => {
  dir = await scratch("boxcar-autoscale-");
  auth = await AuthDir.init(join(dir.path, "auth"));
  servers = await monitoredServers(auth, { size: 3 });
  roles = await boxcarRoles(servers, auth);
}, 240_000); // monitoredServers may start the cluster again
afterAll(async () => {
  await roles?.[Symbol.asyncDispose]();
  await servers?.[Symbol.asyncDispose]();
  await dir?.[Symbol.asyncDispose]();
});

test("KEDA's lag per priority consumer rises with queued jobs, falls as a worker drains them, and reaches 0", async () => {
  await roles.topology.ensurePoolConsumer("default");
  const { client } = roles;
  await client.applyAgent({ name: "nap", command: "sleep 0.2", runtime: { sandbox: "host" }, trusted: true });
  const queued: Record<Priority, number> = { high: 5, normal: 10, low: 3 };
  for (const priority of PRIORITIES) {
    for (let i = 0; i < queued[priority]; i++) await client.submit({ agent: "nap", priority });
  }
  const triggers = await kedaYamlTriggers(servers.monitoringEndpoint, auth.accountKey);
  // One scaler per trigger and release, polled again and again as KEDA does: it keeps the
  // server that leads its consumer between polls.
  const scalers = (release: KedaRelease) =>
    Object.fromEntries(PRIORITIES.map((p) => [p, new KedaJetStreamScaler(release, triggers[p])])) as Record<Priority, KedaJetStreamScaler>;
  const releases = { "2.16": scalers("2.16"), "2.20": scalers("2.20") };
  const lags = async () => {
    const read = async (release: keyof typeof releases) =>
      Object.fromEntries(await Promise.all(PRIORITIES.map(async (p) => [p, (await releases[release][p].poll()).lag]))) as Record<
        Priority,
        number
      >;
    const [old, current] = await Promise.all([read("2.16"), read("2.20")]);
    // Both releases read the same consumers (a job may end between their reads: at most its own).
    for (const p of PRIORITIES) expect(Math.abs(old[p] - current[p])).toBeLessThanOrEqual(2);
    return old;
  };
  // No worker yet: the lag of each consumer is its queued jobs.
  await eventually(async () => {
    const now = await lags();
    return PRIORITIES.every((p) => now[p] === queued[p]) ? true : undefined;
  }, "the lag to count the queued jobs");
  // The first poll on a cluster: the entry server's /jsz (its meta group has 3 servers), its /varz
  // for the servers' client URLs, then /varz (for the name) and /jsz on each host at the
  // monitoring port, until the one that leads the consumer.
  const hosts = servers.monitors.map((m) => new URL(m).host);
  const first = releases["2.16"].normal.requests;
  expect(first[0]).toBe(`http://${hosts[0]}/jsz?acc=${auth.accountKey}&consumers=true&config=true`);
  expect(first[1]).toBe(`http://${hosts[0]}/varz`);
  expect(first.slice(2).every((r) => hosts.some((h) => r.startsWith(`http://${h}/`)))).toBe(true);

  const worker = roles.startWorker(2);
  const samples: number[] = [];
  await eventually(
    async () => {
      const now = await lags();
      samples.push(PRIORITIES.reduce((sum, p) => sum + now[p], 0));
      return samples.at(-1) === 0 ? true : undefined;
    },
    "the lag to reach 0",
    60_000,
  );
  await worker.close();
  process.stdout.write(
    `autoscale signal: queued high 5, normal 10, low 3; summed lag while one worker (2 slots) drains: ${samples.join(" ")}\n`,
  );
  expect(samples[0]).toBeLessThanOrEqual(18);
  expect(samples.at(-1)).toBe(0);
  // It falls: never above an earlier sample by more than the jobs a sweep takes at once.
  for (let i = 1; i < samples.length; i++) expect(samples[i]).toBeLessThanOrEqual((samples[i - 1] as number) + 2);
  // Idle: it stays 0.
  expect(Object.values(await lags())).toEqual([0, 0, 0]);
}, 120_000);
