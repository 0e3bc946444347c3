import { setTimeout as sleep } from "node:timers/promises";
import { silentLogger } from "@boxcar/common";
import type { Topology } from "@boxcar/fabric";
import { type NatsTestServer, natsTestServer } from "@boxcar/fabric/testing";
import { AgentDefinition, ErrorCode } from "@boxcar/protocol";
import { afterAll, beforeAll, beforeEach, describe, expect, test } from "vitest";
import { AgentCatalog } from "./agent-catalog.js";

// Against a real nats-server: the catalog is a watch of the agents bucket.
let nats: NatsTestServer;
let topology: Topology;

beforeAll(async () => {
  nats = await natsTestServer();
});
afterAll(async () => {
  await nats?.close();
});
beforeEach(async () => {
  topology = await nats.topology();
});

const agent = (script: string) => AgentDefinition.parse({ name: "echo", command: script });
/** The script an agent runs (`sh -c SCRIPT`). */
const script = (a: AgentDefinition) => a.command?.at(-1);
/** What another dispatcher does: writes the bucket directly. */
const putElsewhere = (command: string) => topology.agents.put("echo", JSON.stringify(agent(command)));

async function until<T>(read: () => Promise<T>, done: (value: T) => boolean): Promise<T> {
  for (let i = 0; i < 200; i++) {
    const value = await read();
    if (done(value)) return value;
    await sleep(10);
  }
  throw new Error("timed out waiting");
}

describe("AgentCatalog", () => {
  test("an agent applied through this dispatcher is known at once", async () => {
    const catalog = await AgentCatalog.open(topology, silentLogger);
    expect(await catalog.apply(agent("true"))).toBe(true);
    expect(script(await catalog.get("echo"))).toBe("true");
    expect(await catalog.apply(agent("false"))).toBe(false);
    expect(script(await catalog.get("echo"))).toBe("false");
    await catalog.remove("echo");
    await expect(catalog.get("echo")).rejects.toMatchObject({ code: ErrorCode.unknownAgent });
    catalog.close();
  });

  test("agents applied, changed and removed through another dispatcher are followed", async () => {
    await putElsewhere("before");
    const catalog = await AgentCatalog.open(topology, silentLogger);
    expect(script(await catalog.get("echo"))).toBe("before");
    await putElsewhere("after");
    await until(
      () => catalog.get("echo"),
      (a) => script(a) === "after",
    );
    await topology.agents.delete("echo");
    const refused = await until(
      () =>
        catalog.get("echo").then(
          () => undefined,
          (err: unknown) => err,
        ),
      (err) => err !== undefined,
    );
    expect(refused).toMatchObject({ code: ErrorCode.unknownAgent, message: expect.stringContaining("boxcar agent apply") });
    catalog.close();
  });

  test("an agent the watch has not brought yet is read from the bucket", async () => {
    const catalog = await AgentCatalog.open(topology, silentLogger);
    catalog.close(); // the watch hears nothing more
    await putElsewhere("late");
    expect(script(await catalog.get("echo"))).toBe("late");
    await expect(catalog.get("nobody")).rejects.toMatchObject({ code: ErrorCode.unknownAgent });
  });
});
