/**
 * Session templates (docs/sessions.md#templates), against a real nats-server with authentication
 * and a real Docker engine: an admin allows a template (an image built or tagged on the engine) in
 * the system policy; a submitter opens a session of a Docker agent from it, and the session's
 * container runs that image; an unknown template, one whose image is not on the engine and one
 * for an agent whose sessions are not Docker are refused, saying why; only an admin sets them.
 */

import { execFileSync } from "node:child_process";
import { AGENT_IMAGE, dockerReady, eventually } from "@boxcar/testing";
import Docker from "dockerode";
import { afterAll, beforeAll, describe, expect, test } from "vitest";
import { boxcar } from "./helpers/cli.js";
import { dockerSessions, type Principal, type SecuredSystem } from "./helpers/secured.js";

const ready = await dockerReady();
const TAG = `boxcar-template-test:${process.pid}`;
const MISSING = `boxcar-template-missing:${process.pid}`;
const text = (base64: string) => Buffer.from(base64, "base64").toString("utf8");

describe.skipIf(!ready)("session templates", () => {
  let system: SecuredSystem;
  let alice: Principal;
  let admin: Principal;

  beforeAll(async () => {
    execFileSync("docker", ["tag", AGENT_IMAGE, TAG]);
    ({ system, alice } = await dockerSessions());
    admin = await system.as("admin", "admin");
    await admin.client.applyAgent({ name: "hostbox", command: ["true"], sessions: true, runtime: { sandbox: "host", timeout: "1m" } });
    const policy = await admin.client.getPolicy();
    await admin.client.setPolicy({
      ...policy,
      sessions: {
        templates: {
          tagged: { image: TAG, description: "the agent image under another name" },
          gone: { image: MISSING },
        },
      },
    });
  }, 60_000);

  afterAll(async () => {
    await system?.[Symbol.asyncDispose]();
    if (ready) execFileSync("docker", ["rmi", TAG]);
  });

  test("a session opened from a template runs its image, with the agent's hardening; its record names the template", async () => {
    // The policy reaches the dispatcher through its watch: until then the template is unknown.
    const session = await eventually(
      () => alice.client.openSession({ agent: "box", template: "tagged" }).catch(() => undefined),
      "the template to be known",
    );
    expect(session).toMatchObject({ template: "tagged", sandbox: { kind: "docker" }, owner: "alice" });
    expect(await alice.client.getSession(session.id)).toMatchObject({ template: "tagged" });
    const container = await new Docker().getContainer(`boxcar-${session.sandbox.id}`).inspect();
    expect(container.Config.Image).toBe(TAG);
    expect(container.HostConfig.CapDrop).toContain("ALL");
    expect(container.HostConfig.ReadonlyRootfs).toBe(true);
    expect(container.HostConfig.NetworkMode).toBe("none");
    const ran = await alice.client.execInSession({ id: session.id, argv: ["sh", "-c", "echo hi from $(id -u)"] });
    expect(ran.exitCode).toBe(0);
    expect(text(ran.stdout)).toBe("hi from 1000\n");
    await alice.client.closeSession(session.id);
  });

  test("an unknown template, a missing image and a host agent's session are refused, saying why", async () => {
    await expect(alice.client.openSession({ agent: "box", template: "nope" })).rejects.toMatchObject({
      code: "invalid",
      message: expect.stringMatching(/no session template nope \(known: gone, tagged;/),
    });
    await expect(alice.client.openSession({ agent: "box", template: "gone" })).rejects.toMatchObject({
      code: "no_sandbox",
      message: `image ${MISSING} of template gone is not on this worker's engine; an admin builds or pulls it`,
    });
    await expect(admin.client.openSession({ agent: "hostbox", template: "tagged" })).rejects.toMatchObject({
      code: "invalid",
      message: expect.stringContaining("templates are for Docker sessions"),
    });
    // The missing image's slot was given back: a session still opens.
    const again = await alice.client.openSession({ agent: "box", template: "tagged" });
    await alice.client.closeSession(again.id);
    expect(await alice.client.listSessions({ state: "open" })).toEqual([]);
  });

  test("only an admin sets templates; a bad one is refused", async () => {
    const policy = await admin.client.getPolicy();
    await expect(alice.client.setPolicy({ ...policy, sessions: { templates: { mine: { image: "alpine" } } } })).rejects.toMatchObject({
      code: "forbidden",
    });
    await expect(admin.client.setPolicy({ ...policy, sessions: { templates: { "bad name": { image: "x" } } } })).rejects.toMatchObject({
      code: "invalid",
    });
    await expect(admin.client.setPolicy({ ...policy, sessions: { templates: { empty: { image: "" } } } })).rejects.toMatchObject({
      code: "invalid",
    });
    expect(Object.keys((await admin.client.getPolicy()).sessions.templates).sort()).toEqual(["gone", "tagged"]);
  });

  test("boxcar session open AGENT --template NAME", async () => {
    const cli = (args: string[]) => boxcar(system.url, system.prefix, args, { NATS_CREDS: alice.creds });
    const opened = await cli(["session", "open", "box", "--template", "tagged"]);
    expect(opened.code).toBe(0);
    const id = opened.stdout.trim();
    expect(await alice.client.getSession(id)).toMatchObject({ template: "tagged" });
    expect((await cli(["session", "close", id])).code).toBe(0);
    const refused = await cli(["session", "open", "box", "--template", "nope"]);
    expect(refused.code).not.toBe(0);
    expect(refused.stderr).toContain("no session template nope");
  });
});
