/**
 * Sessions in Docker sandboxes against a real nats-server with authentication, a dispatcher, a
 * worker and a real Docker engine: a submitter's session, its files and commands through the
 * resident helper, output live, cancel and timeouts, the job containers' hardening inside it, the
 * attacks on the files API and on the helper, and the bounds that remove its container.
 */

import { type ChildProcess, execFileSync, spawn } from "node:child_process";
import { existsSync, readFileSync } from "node:fs";
import { createServer as createHttpsServer } from "node:https";
import { createServer, Socket } from "node:net";
import { hostname } from "node:os";
import { join } from "node:path";
import { BoxcarError } from "@boxcar/protocol";
import { dockerReady, eventually, type Scratch, scratch } from "@boxcar/testing";
import Docker from "dockerode";
import { afterAll, beforeAll, describe, expect, test } from "vitest";
import { boxcar, exited } from "./helpers/cli.js";
import { sessionOnDoomedWorker } from "./helpers/doomed.js";
import { dockerSessions, type Principal, type SecuredSystem } from "./helpers/secured.js";

const ready = await dockerReady();
const text = (base64: string) => Buffer.from(base64, "base64").toString("utf8");
const SECRET = `box-token-${Date.now()}`;

describe.skipIf(!ready)("sessions in Docker sandboxes (real engine)", () => {
  let system: SecuredSystem;
  let alice: Principal;
  let bob: Principal;
  let viewer: Principal;
  const engine = new Docker();

  /** The session's container, by its label. */
  const containerOf = async (sessionId: string) =>
    (await engine.listContainers({ all: true, filters: { label: [`boxcar.session=${sessionId}`] } }))[0];

  /** Alice's session once it has closed (by itself). */
  const closedSoon = (id: string, ms?: number) =>
    eventually(
      async () => {
        const s = await alice.client.getSession(id);
        return s.state === "closed" ? s : undefined;
      },
      `session ${id} to close`,
      ms,
    );

  beforeAll(async () => {
    ({ system, alice, bob, viewer } = await dockerSessions({
      system: { reapIntervalMs: 500, secretsEnv: { BOX_TOKEN: SECRET } },
      box: { env: { FROM_AGENT: "agent-env" }, runtime: { sandbox: "docker", timeout: "1m", limits: { memory: "256Mi", pids: 64 } } },
    }));
  }, 60_000);

  afterAll(async () => {
    await system?.[Symbol.asyncDispose]();
  });

  test("a submitter's session: files written through the API are read by commands, and the other way round", async () => {
    const session = await alice.client.openSession({ agent: "box" });
    expect(session).toMatchObject({ owner: "alice", state: "open", sandbox: { kind: "docker" } });
    expect(await alice.client.writeSessionFile(session.id, "src/hello.txt", "from the API\n")).toEqual({ path: "src/hello.txt", size: 13 });
    const read = await alice.client.execInSession({ id: session.id, argv: ["cat", "hello.txt"], cwd: "src" });
    expect(read).toMatchObject({ exitCode: 0, cancelled: false, timedOut: false });
    expect(text(read.stdout)).toBe("from the API\n");
    // The command may change what the worker wrote: it is the agent's user's.
    const made = await alice.client.execInSession({
      id: session.id,
      argv: ["sh", "-c", 'echo changed >> src/hello.txt && mkdir out && tr a-z A-Z > out/upper.txt && echo "$FROM_AGENT $PWD $(id -u)"'],
      stdin: Buffer.from("piped in\n").toString("base64"),
    });
    expect(text(made.stderr)).toBe("");
    expect(text(made.stdout)).toBe("agent-env /workspace 1000\n");
    expect(Buffer.from(await alice.client.readSessionFile(session.id, "out/upper.txt")).toString()).toBe("PIPED IN\n");
    expect((await alice.client.listSessionFiles({ id: session.id })).files).toEqual([
      { path: "out/upper.txt", size: 9 },
      { path: "src/hello.txt", size: 21 },
    ]);
    expect((await alice.client.listSessionFiles({ id: session.id, path: "out" })).files.map((f) => f.path)).toEqual(["out/upper.txt"]);
    expect(await alice.client.removeSessionFile(session.id, "out")).toBe(true);
    expect(await alice.client.removeSessionFile(session.id, "out")).toBe(false);
    await expect(alice.client.readSessionFile(session.id, "out/upper.txt")).rejects.toMatchObject({ code: "not_found" });
    const ls = await alice.client.execInSession({ id: session.id, argv: ["ls"] });
    expect(text(ls.stdout)).toBe("src\n");
    await alice.client.closeSession(session.id);
  });

  test("files: a named pipe is refused, not waited on; a missing folder is not_found; UTF-8 names come back whole; 500 KiB each way; executable", async () => {
    const session = await alice.client.openSession({ agent: "box" });
    await alice.client.execInSession({ id: session.id, argv: ["mkfifo", "pipe"] });
    await expect(alice.client.writeSessionFile(session.id, "pipe", "x")).rejects.toMatchObject({ code: "invalid" });
    await expect(alice.client.listSessionFiles({ id: session.id, path: "nope" })).rejects.toMatchObject({ code: "not_found" });
    await expect(alice.client.execInSession({ id: session.id, argv: ["true"], cwd: "nope" })).rejects.toThrow(/cwd nope: no such folder/);
    // Names of multi-byte characters, enough of them that lines split anywhere.
    // (about 150 KB of listing: the engine hands it over in several chunks).
    const name = "€ü".repeat(20);
    await alice.client.execInSession({
      id: session.id,
      argv: ["sh", "-c", `mkdir u && cd u && for i in $(seq 1 1500); do : > "${name}-$i"; done`],
    });
    const listed = await alice.client.listSessionFiles({ id: session.id, path: "u", limit: 2000 });
    expect(listed.files).toHaveLength(1500);
    expect(listed.files.filter((f) => !f.path.startsWith(`u/${name}-`))).toEqual([]);
    const big = Buffer.alloc(500 * 1024, 7);
    await alice.client.writeSessionFile(session.id, "bin/tool", Buffer.concat([Buffer.from("#!/bin/sh\necho tool ran\nexit 0\n"), big]), {
      executable: true,
    });
    expect(text((await alice.client.execInSession({ id: session.id, argv: ["bin/tool"] })).stdout)).toBe("tool ran\n");
    expect((await alice.client.readSessionFile(session.id, "bin/tool")).length).toBe(big.length + 31);
    // The helper still answers: nothing above left it stuck.
    expect((await alice.client.execInSession({ id: session.id, argv: ["true"] })).exitCode).toBe(0);
    await alice.client.closeSession(session.id);
  });

  test("attack: a helper held still (a command stops it) costs the worker four file operations at most, then ends the session", async () => {
    const session = await alice.client.openSession({ agent: "box", idleTimeout: "24h" });
    // From outside the command's process group, so the command itself ends normally.
    await alice.client.execInSession({
      id: session.id,
      // It waits until the stopper has left its process group (which the helper kills when the command ends).
      argv: [
        "sh",
        "-c",
        'p=$PPID; setsid sh -c "echo x > /tmp/stopper; sleep 1; kill -STOP $p" </dev/null >/dev/null 2>&1 & while [ ! -s /tmp/stopper ]; do sleep 0.05; done',
      ],
    });
    // Until the helper is stopped (on a busy machine the sleep may take longer than a second).
    const container = engine.getContainer((await containerOf(session.id))?.Id as string);
    await eventually(async () => {
      const top = (await container.top({ ps_args: "-o pid,stat,args" })) as { Processes: string[][] };
      return top.Processes.some(([, stat, args]) => stat?.startsWith("T") && args?.includes("node -e")) || undefined;
    }, "the helper to be stopped");
    const reads = Array.from({ length: 6 }, () =>
      alice.client.readSessionFile(session.id, "x").then(
        () => "answered",
        (err: BoxcarError) => err.code,
      ),
    );
    const refused = await Promise.race([Promise.all(reads.slice(4)), new Promise((r) => setTimeout(() => r("waited"), 5_000))]);
    expect(refused).toEqual(["conflict", "conflict"]);
    const closed = await closedSoon(session.id, 45_000);
    expect(closed.reason).toMatch(/did not answer a file operation/);
    expect(await containerOf(session.id)).toBeUndefined();
  }, 60_000);

  test("a submitter's session gets none of the agent's secrets (its owner could read them); an admin's does", async () => {
    const admin = await system.as("admin", "admin");
    await admin.client.applyAgent({
      name: "box-secret",
      command: ["true"],
      sessions: true,
      secrets: [{ name: "TOKEN", from: "BOX_TOKEN" }],
      runtime: { sandbox: "docker" },
    });
    const probe = ["sh", "-c", 'test -n "$TOKEN" && echo has-token || echo no-token; env | base64 -w0'];
    const mine = await alice.client.openSession({ agent: "box-secret" });
    const ran = await alice.client.execInSession({ id: mine.id, argv: probe });
    expect(text(ran.stdout)).toMatch(/^no-token\n/);
    expect(Buffer.from(text(ran.stdout).split("\n")[1] ?? "", "base64").toString()).not.toContain(SECRET);
    await alice.client.closeSession(mine.id);
    const admins = await admin.client.openSession({ agent: "box-secret" });
    expect(text((await admin.client.execInSession({ id: admins.id, argv: probe })).stdout)).toMatch(/^has-token\n/);
    await admin.client.closeSession(admins.id);
  });

  test("the job containers' hardening holds in a session: user, read-only root, no network, no capabilities, limits, nothing of it in the container's configuration", async () => {
    const session = await alice.client.openSession({ agent: "box" });
    const probe = await alice.client.execInSession({
      id: session.id,
      argv: [
        "sh",
        "-c",
        "id -u; touch /etc/x 2>/dev/null && echo root-writable || echo root-read-only; grep -c : /proc/net/dev; grep CapEff /proc/self/status",
      ],
      env: { SESSION_SECRET: "only-in-the-command" },
    });
    const [uid, root, interfaces, caps] = text(probe.stdout).trim().split("\n");
    expect(uid).toBe("1000");
    expect(root).toBe("root-read-only");
    expect(interfaces).toBe("1"); // lo only
    expect(caps).toMatch(/CapEff:\s+0+$/);
    const info = await engine.getContainer((await containerOf(session.id))?.Id as string).inspect();
    expect(info.HostConfig).toMatchObject({
      ReadonlyRootfs: true,
      CapDrop: ["ALL"],
      SecurityOpt: ["no-new-privileges"],
      NetworkMode: "none",
      Memory: 256 * 1024 * 1024,
      PidsLimit: 64,
    });
    expect(info.Config.User).toBe("1000:1000");
    expect(JSON.stringify(info.Config)).not.toContain("only-in-the-command");
    await alice.client.closeSession(session.id);
  });

  test("a long output comes live while the command runs, all of it in order", async () => {
    const session = await alice.client.openSession({ agent: "box" });
    const live: string[] = [];
    const sub = alice.nc.subscribe(alice.names.subjects.jobLogs("alice", session.id), {
      callback: (_e, msg) => {
        live.push(msg.string());
      },
    });
    const running = alice.client.execInSession({
      id: session.id,
      argv: ["sh", "-c", "for i in $(seq 1 2000); do echo line-$i; done; sleep 2; for i in $(seq 2001 4000); do echo line-$i; done"],
    });
    await eventually(async () => (live.join("").includes("line-2000\n") ? true : undefined), "the first half while the command sleeps");
    expect(live.join("")).not.toContain("line-2001");
    const ran = await running;
    sub.unsubscribe();
    const expected = Array.from({ length: 4000 }, (_, i) => `line-${i + 1}\n`).join("");
    expect(text(ran.stdout)).toBe(expected);
    expect(live.join("")).toBe(expected);
    await alice.client.closeSession(session.id);
  });

  test("cancel stops the running command and all it started; a timeout does the same; the session goes on", async () => {
    const session = await alice.client.openSession({ agent: "box" });
    const slow = alice.client.execInSession({ id: session.id, argv: ["sh", "-c", "sleep 300 & sleep 300"] });
    await eventually(async () => ((await alice.client.getSession(session.id)).execs === 0 ? true : undefined), "open");
    await new Promise((r) => setTimeout(r, 300));
    await expect(alice.client.execInSession({ id: session.id, argv: ["true"] })).rejects.toMatchObject({ code: "conflict" });
    const started = Date.now();
    await alice.client.cancelInSession(session.id);
    expect(await slow).toMatchObject({ cancelled: true, timedOut: false, exitCode: null });
    expect(Date.now() - started).toBeLessThan(10_000);
    const timed = await alice.client.execInSession({ id: session.id, argv: ["sh", "-c", "sleep 300 & sleep 300"], timeout: "1s" });
    expect(timed).toMatchObject({ timedOut: true, cancelled: false, exitCode: null });
    const ps = await alice.client.execInSession({ id: session.id, argv: ["sh", "-c", "ps -eo comm | grep -c sleep || true"] });
    expect(text(ps.stdout).trim()).toBe("0");
    await expect(alice.client.cancelInSession(session.id)).rejects.toMatchObject({ code: "conflict" });
    await alice.client.closeSession(session.id);
  });

  test("only its owner reaches a session's files: another submitter finds none, a viewer may not", async () => {
    const session = await alice.client.openSession({ agent: "box" });
    await alice.client.writeSessionFile(session.id, "private.txt", "alice's");
    await expect(bob.client.readSessionFile(session.id, "private.txt")).rejects.toMatchObject({ code: "not_found" });
    await expect(bob.client.writeSessionFile(session.id, "private.txt", "bob's")).rejects.toMatchObject({ code: "not_found" });
    await expect(bob.client.cancelInSession(session.id)).rejects.toMatchObject({ code: "not_found" });
    await expect(viewer.client.readSessionFile(session.id, "private.txt")).rejects.toMatchObject({ code: "forbidden" });
    expect(Buffer.from(await alice.client.readSessionFile(session.id, "private.txt")).toString()).toBe("alice's");
    await alice.client.closeSession(session.id);
  });

  test("attack: paths out of the workspace are refused, and a symlink to / leads into the container, never onto the worker's machine", async () => {
    const session = await alice.client.openSession({ agent: "box" });
    for (const path of ["../etc/passwd", "/etc/passwd", "a/../../x"]) {
      await expect(alice.client.readSessionFile(session.id, path)).rejects.toMatchObject({ code: "invalid" });
    }
    await expect(alice.client.execInSession({ id: session.id, argv: ["true"], cwd: "../.." })).rejects.toMatchObject({ code: "invalid" });
    // A command swaps a folder for a link to / : the files API follows it inside the container.
    await alice.client.execInSession({ id: session.id, argv: ["ln", "-s", "/", "hostroot"] });
    const seen = Buffer.from(await alice.client.readSessionFile(session.id, "hostroot/etc/hostname"))
      .toString()
      .trim();
    const inside = text((await alice.client.execInSession({ id: session.id, argv: ["cat", "/etc/hostname"] })).stdout).trim();
    expect(seen).toBe(inside);
    expect(seen).not.toBe(hostname());
    const marker = `boxcar-escape-${Date.now()}`;
    await alice.client.writeSessionFile(session.id, `hostroot/tmp/${marker}`, "x");
    expect(existsSync(`/tmp/${marker}`)).toBe(false);
    // A file larger than a request may carry is refused, naming the bound.
    await alice.client.execInSession({ id: session.id, argv: ["sh", "-c", "head -c 600000 /dev/zero > big.bin"] });
    await expect(alice.client.readSessionFile(session.id, "big.bin")).rejects.toMatchObject({ code: "too_large" });
    await alice.client.closeSession(session.id);
  });

  test("attack: a command that kills the helper ends its session, and the container goes", async () => {
    const session = await alice.client.openSession({ agent: "box" });
    await expect(alice.client.execInSession({ id: session.id, argv: ["sh", "-c", "kill -9 $PPID; sleep 5"] })).rejects.toMatchObject({
      code: "sandbox_failed",
    });
    const closed = await closedSoon(session.id);
    expect(closed.reason).toMatch(/^sandbox_ended/);
    await eventually(async () => ((await containerOf(session.id)) ? undefined : true), "the container removed");
  });

  test("snapshot and resume: folders and regular files come back (modes too), links do not; only its owner resumes it", async () => {
    const session = await alice.client.openSession({ agent: "box" });
    await alice.client.execInSession({
      id: session.id,
      argv: [
        "sh",
        "-c",
        "mkdir -p src/deep && echo kept > src/deep/note.txt && printf '#!/bin/sh\necho ran\n' > run.sh && chmod +x run.sh && ln -s /etc/passwd link",
      ],
    });
    // Taken while a command runs: the container is paused while its workspace is read, and the command goes on after.
    const running = alice.client.execInSession({ id: session.id, argv: ["sh", "-c", "sleep 1; echo done"] });
    const snapshot = await alice.client.snapshotSession(session.id);
    expect(snapshot).toMatchObject({ owner: "alice", agent: "box", session: session.id, digest: expect.stringMatching(/^SHA-256=/) });
    expect(snapshot.size).toBeGreaterThan(0);
    expect(text((await running).stdout)).toBe("done\n");
    await alice.client.closeSession(session.id);

    await expect(bob.client.openSession({ from: snapshot.id })).rejects.toMatchObject({ code: "not_found" });
    expect((await bob.client.listSnapshots()).map((s) => s.id)).not.toContain(snapshot.id);
    expect((await viewer.client.listSnapshots()).map((s) => s.id)).toContain(snapshot.id);

    const resumed = await alice.client.openSession({ from: snapshot.id });
    expect(resumed).toMatchObject({ agent: "box", owner: "alice" });
    const look = await alice.client.execInSession({ id: resumed.id, argv: ["sh", "-c", "cat src/deep/note.txt; ./run.sh; ls -A; id -u"] });
    expect(text(look.stdout)).toBe("kept\nran\nrun.sh\nsrc\n1000\n");
    // The resumed files are the agent's user's: a command may change them.
    expect((await alice.client.execInSession({ id: resumed.id, argv: ["sh", "-c", "echo more >> src/deep/note.txt"] })).exitCode).toBe(0);
    const events = [];
    for await (const event of alice.client.sessionEvents(resumed.id)) events.push(event);
    expect(events[0]).toMatchObject({ type: "opened", snapshot: snapshot.id });
    await alice.client.closeSession(resumed.id);

    expect(await alice.client.removeSnapshot(snapshot.id)).toMatchObject({ id: snapshot.id });
    await expect(alice.client.openSession({ from: snapshot.id })).rejects.toMatchObject({ code: "not_found" });
  });

  describe("a workspace cloned from git", () => {
    let daemon: ChildProcess;
    let folder: Scratch;
    let base: string;
    let url: string;
    let feature: string;

    beforeAll(async () => {
      // A bare repository, served by `git daemon` on a free port (git://, no credential).
      folder = await scratch("boxcar-git-");
      base = folder.path;
      const sh = (cmd: string, cwd = base) =>
        execFileSync("sh", ["-c", cmd], { cwd, env: { ...process.env, HOME: base } })
          .toString()
          .trim();
      sh("git init -q --bare repo.git && git init -q -b main work");
      const work = join(base, "work");
      sh(
        "git config user.email t@e && git config user.name t && echo hello > README && ln -s /etc/passwd link && git add . && git commit -qm one && " +
          "echo two >> README && git commit -qam two && git checkout -qb feature && echo f > feature.txt && git add . && git commit -qm three && " +
          "git push -q ../repo.git main feature",
        work,
      );
      feature = sh("git rev-parse feature", work);
      const port = await freePort();
      daemon = spawn(
        "git",
        ["daemon", "--reuseaddr", "--export-all", `--base-path=${base}`, "--listen=127.0.0.1", `--port=${port}`, base],
        {
          stdio: "ignore",
        },
      );
      url = `git://127.0.0.1:${port}/repo.git`;
      await eventually(async () => (await canConnect(port)) || undefined, "git daemon to listen");
      const admin = await system.as("admin", "admin");
      await admin.client.applyAgent({
        name: "box-git",
        command: ["true"],
        sessions: true,
        git: { hosts: [`127.0.0.1:${port}`] },
        runtime: { sandbox: "docker" },
      });
    });

    afterAll(async () => {
      daemon?.kill();
      await folder?.[Symbol.asyncDispose]();
    });

    test("attack: a listed https host that redirects gets no clone followed elsewhere, and the credential goes to no other host", async () => {
      // A self-signed certificate the worker's git trusts (as an operator's GIT_SSL_CAINFO would say).
      const tls = join(base, "tls");
      execFileSync("sh", [
        "-c",
        `mkdir -p ${tls} && openssl req -x509 -newkey rsa:2048 -nodes -keyout ${tls}/key.pem -out ${tls}/cert.pem -days 1 -subj /CN=127.0.0.1 -addext subjectAltName=IP:127.0.0.1 2>/dev/null`,
      ]);
      const credentials = { key: readFileSync(join(tls, "key.pem")), cert: readFileSync(join(tls, "cert.pem")) };
      const elsewhere: string[] = [];
      const other = createHttpsServer(credentials, (req, res) => {
        elsewhere.push(`${req.url} ${req.headers.authorization ?? "no credential"}`);
        res.writeHead(404).end();
      });
      const listed = createHttpsServer(credentials, (req, res) => {
        res.writeHead(302, { location: `https://127.0.0.1:${(other.address() as { port: number }).port}${req.url}` }).end();
      });
      await Promise.all([other, listed].map((server) => new Promise<void>((r) => server.listen(0, "127.0.0.1", r))));
      const port = (listed.address() as { port: number }).port;
      const admin = await system.as("admin", "admin");
      await admin.client.applyAgent({
        name: "box-redirect",
        command: ["true"],
        sessions: true,
        git: { hosts: [`127.0.0.1:${port}`], credential: "BOX_TOKEN" },
        runtime: { sandbox: "docker" },
      });
      process.env.GIT_SSL_CAINFO = join(tls, "cert.pem");
      try {
        await expect(
          alice.client.openSession({ agent: "box-redirect", git: { url: `https://127.0.0.1:${port}/repo.git` } }),
        ).rejects.toMatchObject({
          code: "invalid",
          message: expect.stringContaining("git clone failed"),
        });
      } finally {
        delete process.env.GIT_SSL_CAINFO;
        other.close();
        listed.close();
      }
      expect(elsewhere).toEqual([]);
    });

    test("a branch at a depth: its files, its one commit, its symlink as a plain file; the record names the commit", async () => {
      const session = await alice.client.openSession({ agent: "box-git", git: { url, ref: "feature", depth: 1 } });
      expect(session.source).toEqual({ git: { url, ref: "feature", commit: feature } });
      const look = await alice.client.execInSession({
        id: session.id,
        argv: [
          "sh",
          "-c",
          "cat README feature.txt; git log --oneline | wc -l; test -L link && echo symlink || (cat link; echo); id -u; touch mine",
        ],
      });
      expect(text(look.stderr)).toBe("");
      expect(text(look.stdout)).toBe("hello\ntwo\nf\n1\n/etc/passwd\n1000\n");
      await alice.client.closeSession(session.id);
    });

    test("refused: a host the agent does not list (or lists without the port), an agent with no git hosts, a user in the URL, a missing branch, a snapshot and git at once", async () => {
      const admin = await system.as("admin", "admin");
      const other = url.replace("127.0.0.1", "localhost");
      await expect(alice.client.openSession({ agent: "box-git", git: { url: other } })).rejects.toMatchObject({
        code: "forbidden",
        message: expect.stringContaining("clones only from 127.0.0.1"),
      });
      await expect(alice.client.openSession({ agent: "box", git: { url } })).rejects.toMatchObject({ code: "forbidden" });
      // A name without its port allows the scheme's own port only.
      await admin.client.applyAgent({
        name: "box-git-noport",
        command: ["true"],
        sessions: true,
        git: { hosts: ["127.0.0.1"] },
        runtime: { sandbox: "docker" },
      });
      await expect(alice.client.openSession({ agent: "box-git-noport", git: { url } })).rejects.toMatchObject({ code: "forbidden" });
      await expect(
        alice.client.openSession({ agent: "box-git", git: { url: url.replace("git://", "git://me:pw@") } }),
      ).rejects.toMatchObject({
        code: "invalid",
      });
      await expect(alice.client.openSession({ agent: "box-git", git: { url, ref: "nope" } })).rejects.toMatchObject({
        code: "invalid",
        message: expect.stringMatching(/git clone failed: .*nope/),
      });
      await expect(alice.client.openSession({ agent: "box-git", from: "snap-x", git: { url } })).rejects.toMatchObject({ code: "invalid" });
      // Nothing was left open by the refusals.
      expect(
        (await alice.client.listSessions({ state: "open" })).filter((s) => s.agent === "box-git").map((s) => [s.id, s.source, s.createdAt]),
      ).toEqual([]);
    });
  });

  test("a workspace that starts with a job's artifacts, at their paths; another submitter's job gives none", async () => {
    const admin = await system.as("admin", "admin");
    await admin.client.applyAgent({
      name: "maker",
      command: ["sh", "-c", "mkdir -p out/sub && echo made > out/a.txt && echo deeper > out/sub/b.txt && echo scratch > tmp.txt"],
      runtime: { sandbox: "docker" },
    });
    const { job } = await alice.client.submit({ agent: "maker" });
    expect((await alice.client.waitForJob(job.id)).state).toBe("succeeded");
    const session = await alice.client.openSession({ agent: "box", artifactsOf: job.id });
    expect(session.source).toEqual({ artifactsOf: job.id });
    const look = await alice.client.execInSession({
      id: session.id,
      argv: ["sh", "-c", "cat out/a.txt out/sub/b.txt; ls; echo more >> out/a.txt"],
    });
    expect(text(look.stdout)).toBe("made\ndeeper\nout\n");
    expect(look.exitCode).toBe(0);
    await alice.client.closeSession(session.id);
    await expect(bob.client.openSession({ agent: "box", artifactsOf: job.id })).rejects.toMatchObject({ code: "not_found" });
    await expect(alice.client.openSession({ agent: "box", artifactsOf: job.id, from: "snap-x" })).rejects.toMatchObject({
      code: "invalid",
    });
  });

  test("a snapshot is one at a time and keeps its session busy: a second is refused, the idle clock waits for it", async () => {
    const session = await alice.client.openSession({ agent: "box", idleTimeout: "1s" });
    // Enough to take longer than the idle bound to store.
    await alice.client.execInSession({ id: session.id, argv: ["sh", "-c", "head -c 200000000 /dev/zero > big"] });
    const started = Date.now();
    const [first, second] = await Promise.allSettled([alice.client.snapshotSession(session.id), alice.client.snapshotSession(session.id)]);
    const took = Date.now() - started;
    const taken = [first, second].filter((r) => r.status === "fulfilled");
    const refused = [first, second].flatMap((r) => (r.status === "rejected" ? [r.reason] : []));
    expect(taken).toHaveLength(1);
    expect(refused).toMatchObject([{ code: "conflict", message: expect.stringContaining("one snapshot at a time") }]);
    expect((taken[0] as PromiseFulfilledResult<{ size: number }>).value.size).toBeGreaterThan(200_000_000);
    // It outlasted the idle bound and the session was not closed under it (its idle clock starts again after).
    if (took > 1_500) expect((await alice.client.getSession(session.id)).state).toBe("open");
    await closedSoon(session.id);
    await alice.client.removeSnapshot((taken[0] as PromiseFulfilledResult<{ id: string }>).value.id);
  }, 60_000);

  test("an idle session closes by itself: its container and workspace removed", async () => {
    const session = await alice.client.openSession({ agent: "box", idleTimeout: "2s" });
    expect(await containerOf(session.id)).toBeDefined();
    const closed = await closedSoon(session.id);
    expect(closed.reason).toBe("idle");
    expect(await containerOf(session.id)).toBeUndefined();
  });

  test("a worker killed with SIGKILL: its session reads lost, its container is reaped, and its snapshot resumes on another worker", async () => {
    const admin = await system.as("admin", "admin");
    const { session, worker: doomed } = await sessionOnDoomedWorker(system, admin, alice);
    try {
      await alice.client.writeSessionFile(session.id, "note.txt", "kept until the end");
      const snapshot = await alice.client.snapshotSession(session.id);
      // Paused while the snapshot was read; running again after.
      const running = await eventually(
        async () => ((await containerOf(session.id))?.State === "running" ? await containerOf(session.id) : undefined),
        "the container to run again",
      );
      const since = Math.floor(Date.now() / 1000) - 1;
      doomed.kill("SIGKILL");
      await exited(doomed);
      // Its stdin closed (StdinOnce), the helper ends and so does the container, with the commands in
      // it, at once: it dies of its own (exit code 0), not of the reaper's SIGKILL (137) later.
      await eventually(
        async () => ((await containerOf(session.id))?.State === "running" ? undefined : true),
        "the container stopped",
        2_000,
      );
      const died = await eventually(async () => {
        const stream = await engine.getEvents({
          since,
          until: Math.ceil(Date.now() / 1000),
          filters: { container: [running?.Id ?? ""], event: ["die"] },
        });
        const text = await new Response(stream as unknown as ReadableStream).text();
        return text.trim()
          ? (JSON.parse(text.trim().split("\n")[0] as string) as { Actor: { Attributes: Record<string, string> } })
          : undefined;
      }, "the container's death");
      expect(died.Actor.Attributes.exitCode).toBe("0");
      // The system's worker reaps it once the presence is gone.
      await eventually(async () => ((await containerOf(session.id)) ? undefined : true), "the container removed", 30_000);
      const lost = await eventually(async () => {
        const s = await alice.client.getSession(session.id);
        return s.state === "lost" ? s : undefined;
      }, "the session to read lost");
      expect(lost.reason).toMatch(/is gone/);
      expect(await alice.client.closeSession(session.id)).toMatchObject({ state: "closed", reason: expect.stringMatching(/^lost/) });
      // Its snapshot resumes on another worker (the agent "box" is the system worker's pool's).
      const resumed = await alice.client.openSession({ agent: "box", from: snapshot.id });
      expect(resumed.workerId).not.toBe(session.workerId);
      expect(Buffer.from(await alice.client.readSessionFile(resumed.id, "note.txt")).toString()).toBe("kept until the end");
      await alice.client.closeSession(resumed.id);
    } finally {
      doomed.kill("SIGKILL");
    }
  });

  test("the CLI: write a file from stdin, run a command in a folder, list, read, remove", async () => {
    const env = { NATS_CREDS: alice.creds };
    const opened = await boxcar(system.url, system.prefix, ["session", "open", "box"], env);
    expect(opened.code).toBe(0);
    const id = opened.stdout.trim();
    const cli = (args: string[], input = "") => boxcar(system.url, system.prefix, args, env, undefined, input);
    expect((await cli(["session", "write", id, "dir/in.txt"], "from stdin\n")).stdout).toContain("wrote 11 bytes to dir/in.txt");
    const ran = await cli(["session", "exec", id, "--cwd", "dir", "--", "sh", "-c", "wc -c < in.txt; exit 4"]);
    expect(ran).toMatchObject({ code: 4, stdout: "11\n" });
    expect((await cli(["session", "ls", id])).stdout).toMatch(/11\s+dir\/in\.txt/);
    expect((await cli(["session", "read", id, "dir/in.txt"])).stdout).toBe("from stdin\n");
    expect((await cli(["session", "rm", id, "dir"])).stdout).toContain("removed dir");
    expect((await cli(["session", "close", id])).code).toBe(0);
  });

  test("a user's quotas of sessions and snapshots: the next one is refused while it holds its quota, and opens once one closes", async () => {
    const admin = await system.as("admin", "admin");
    const carol = await system.as("carol", "submitter");
    const policy = await admin.client.getPolicy();
    await admin.client.setPolicy({
      ...policy,
      quotas: { ...policy.quotas, users: { ...policy.quotas.users, carol: { sessions: 1, snapshots: 1 } } },
    });
    const first = await carol.client.openSession({ agent: "box" });
    await eventually(
      () =>
        carol.client.openSession({ agent: "box" }).then(
          async (extra) => {
            await carol.client.closeSession(extra.id); // the policy had not reached the dispatcher yet
            return undefined;
          },
          (err: BoxcarError) => err,
        ),
      "the quota to apply",
    ).then((err) =>
      expect(err).toMatchObject({ code: "quota_exceeded", message: expect.stringContaining("1 sessions open and a quota of 1") }),
    );
    const kept = await carol.client.snapshotSession(first.id);
    await expect(carol.client.snapshotSession(first.id)).rejects.toMatchObject({
      code: "quota_exceeded",
      message: expect.stringContaining("keeps 1 snapshots and a quota of 1"),
    });
    await carol.client.removeSnapshot(kept.id);
    await carol.client.closeSession(first.id);
    const again = await carol.client.openSession({ agent: "box" });
    await carol.client.closeSession(again.id);
    // Another user's sessions are not carol's.
    const alices = await alice.client.openSession({ agent: "box" });
    const carols = await carol.client.openSession({ agent: "box" });
    await Promise.all([alice.client.closeSession(alices.id), carol.client.closeSession(carols.id)]);
  });

  test("a submitter may not open a host session even where the worker could hold one", async () => {
    const admin = await system.as("admin", "admin");
    await admin.client.applyAgent({ name: "hosted", command: ["true"], trusted: true, sessions: true, runtime: { sandbox: "host" } });
    await expect(alice.client.openSession({ agent: "hosted" })).rejects.toSatisfy(
      (err: unknown) => err instanceof BoxcarError && err.code === "forbidden",
    );
  });
});

/** A port nothing listens on now. */
function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const server = createServer();
    server.once("error", reject);
    server.listen(0, "127.0.0.1", () => {
      const { port } = server.address() as { port: number };
      server.close(() => resolve(port));
    });
  });
}

/** Whether something accepts connections on the port. */
function canConnect(port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const socket = new Socket();
    socket.once("connect", () => {
      socket.destroy();
      resolve(true);
    });
    socket.once("error", () => resolve(false));
    socket.connect(port, "127.0.0.1");
  });
}
