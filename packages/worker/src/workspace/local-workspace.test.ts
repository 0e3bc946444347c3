import { execFile } from "node:child_process";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";
import { describe, expect, test } from "vitest";

const run = promisify(execFile);
// The worker's own user must be an ordinary one: root is stopped by no folder's mode.
const asRoot = process.getuid?.() === 0;
const NOBODY = 65534;

describe.skipIf(!asRoot)("LocalWorkspace.remove for a worker that runs as the agent's user", () => {
  test("removes folders the agent made unreadable and unwritable (chmod 000), and what is in them", async () => {
    const module = fileURLToPath(new URL("../../dist/workspace/local-workspace.js", import.meta.url));
    // What an agent running as the worker's user can leave behind, then the worker's clean-up.
    const script = `
      import { chmod, mkdir, stat, writeFile } from "node:fs/promises";
      import { tmpdir } from "node:os";
      const { WorkspaceRoot } = await import(${JSON.stringify(module)});
      const ws = await new WorkspaceRoot(tmpdir()).create({ workerId: "w-test", sandboxId: "locked" });
      await mkdir(ws.dir + "/locked/inner", { recursive: true });
      await writeFile(ws.dir + "/locked/inner/file", "x");
      await chmod(ws.dir + "/locked/inner", 0);
      await chmod(ws.dir + "/locked", 0);
      await ws.remove();
      process.stdout.write(await stat(ws.dir).then(() => "left behind", () => "gone"));
    `;
    const { stdout } = await run(process.execPath, ["--input-type=module", "-e", script], { uid: NOBODY, gid: NOBODY });
    expect(stdout).toBe("gone");
  });
});

test("attack: a workspace nested past the length of a path (which Node's rm cannot name) is removed all the same", async () => {
  const { WorkspaceRoot } = await import("./local-workspace.js");
  const { tmpdir } = await import("node:os");
  const { existsSync } = await import("node:fs");
  const ws = await new WorkspaceRoot(tmpdir()).create({ workerId: "w-test", sandboxId: "deep" });
  // 3000 levels of `d/`: 6000 characters, past PATH_MAX (4096).
  await run("sh", ["-c", "for i in $(seq 1 3000); do mkdir d && cd d; done; echo kept > data"], { cwd: ws.dir });
  await ws.remove();
  expect(existsSync(ws.dir)).toBe(false);
});
