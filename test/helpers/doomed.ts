import type { ChildProcess } from "node:child_process";
import type { SessionRecord } from "@boxcar/protocol";
import { eventually } from "@boxcar/testing";
import { spawnBoxcar } from "./cli.js";
import type { Principal, SecuredSystem } from "./secured.js";

/**
 * A Docker session of `owner`'s on a worker process of its own (pool `doomed`, heartbeats every
 * 300 ms), for a test to kill: the session and the process (killed here if the session never
 * opens; the test kills it otherwise).
 */
export async function sessionOnDoomedWorker(
  system: SecuredSystem,
  admin: Principal,
  owner: Principal,
): Promise<{ session: SessionRecord; worker: ChildProcess }> {
  await admin.client.applyAgent({ name: "box-doomed", command: ["true"], sessions: true, pool: "doomed", runtime: { sandbox: "docker" } });
  const worker = spawnBoxcar(system.url, system.prefix, ["worker", "--pool", "doomed", "--heartbeat", "300ms"]);
  try {
    const session = await eventually(
      () => owner.client.openSession({ agent: "box-doomed" }).catch(() => undefined),
      "a session on the worker of pool doomed",
    );
    return { session, worker };
  } catch (err) {
    worker.kill("SIGKILL");
    throw err;
  }
}
