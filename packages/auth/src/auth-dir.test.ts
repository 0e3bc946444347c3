import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { decode } from "@nats-io/jwt";
import { afterEach, expect, test, vi } from "vitest";
import { AuthDir } from "./auth-dir.js";

afterEach(() => {
  vi.restoreAllMocks();
});

test("a short-lived credential lives exactly its lifetime, though a second begins between the clock's reads", async () => {
  const dir = await mkdtemp(join(tmpdir(), "boxcar-auth-"));
  try {
    const auth = await AuthDir.init(dir, { tls: false });
    // The first read is a millisecond before a second begins; every later one in the next second:
    // the lifetime's and the issue time's reads of the first try fall either side of it.
    const second = 1_800_000_000_000;
    let reads = 0;
    vi.spyOn(Date, "now").mockImplementation(() => (reads++ === 0 ? second - 1 : second));
    const creds = await auth.mintShortLived("submitter", "submitter", 600);
    const jwt = /-----BEGIN NATS USER JWT-----\s+(\S+)\s+/.exec(creds)?.[1] as string;
    const claims = decode(jwt) as { iat: number; exp: number };
    expect(reads).toBeGreaterThan(2);
    expect(claims.exp - claims.iat).toBe(600);
    expect(claims.iat).toBe(second / 1000);
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
});
