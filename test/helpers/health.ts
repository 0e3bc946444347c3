import { eventually } from "@boxcar/testing";
import type { spawnBoxcar } from "./cli.js";

export type RoleProcess = ReturnType<typeof spawnBoxcar>;

/** The health endpoint a role logged it listens on (it was given port 0). */
export async function healthOf(role: RoleProcess): Promise<string> {
  const address = await eventually(
    async () => /"health":"([^"]+)"[^\n]*health endpoint listening/.exec(role.output())?.[1],
    "the health endpoint to listen",
  );
  return `http://${address}`;
}

export async function probe(base: string, path: string, method = "GET"): Promise<{ status: number; body: string }> {
  const res = await fetch(`${base}${path}`, { method });
  return { status: res.status, body: await res.text() };
}

/** Polls `path` until it answers `status`; returns the body. */
export async function answers(base: string, path: string, status: number, what: string, ms?: number): Promise<Record<string, string>> {
  const res = await eventually(
    async () => {
      const r = await probe(base, path);
      return r.status === status ? r : undefined;
    },
    what,
    ms,
  );
  return JSON.parse(res.body);
}
