/**
 * `boxcar policy set` says what a new policy drops, and `--merge` keeps what a file leaves out
 * (issue 45, item 5). Against a real nats-server and dispatcher, through the CLI.
 */

import { writeFile } from "node:fs/promises";
import { join } from "node:path";
import { createClient } from "@boxcar/client";
import { startDispatcher } from "@boxcar/dispatcher";
import { natsFixture, scratch } from "@boxcar/testing";
import { expect, test } from "vitest";
import { boxcar } from "./helpers/cli.js";

test("policy set names the settings the file drops; policy set --merge keeps them and adds the file's", async () => {
  await using nats = await natsFixture();
  await using _dispatcher = await startDispatcher({ ...nats.dispatcherRole });
  await using dir = await scratch("boxcar-policy-merge-");
  const pools = join(dir.path, "pools.yaml");
  const budgets = join(dir.path, "budgets.yaml");
  await writeFile(pools, "pools:\n  gpu:\n    concurrency: 2\n");
  await writeFile(budgets, "budgets:\n  users:\n    alice:\n      cost: 5\n");
  const cli = (...args: string[]) => boxcar(nats.url, nats.topology.names.prefix, args);

  expect((await cli("policy", "set", "-f", pools)).code).toBe(0);
  const replaced = await cli("policy", "set", "-f", budgets);
  expect(replaced.code).toBe(0);
  expect(replaced.stdout).toContain("dropped pools.gpu.concurrency (was 2)");
  const client = createClient(nats.topology);
  expect((await client.getPolicy()).pools).toEqual({});

  expect((await cli("policy", "set", "-f", pools)).code).toBe(0);
  const merged = await cli("policy", "set", "--merge", "-f", budgets);
  expect(merged.stdout).not.toContain("dropped");
  const policy = await client.getPolicy();
  expect(policy.pools).toEqual({ gpu: { concurrency: 2 } });
  expect(policy.budgets.users).toEqual({ alice: { cost: 5, onExceeded: "refuse" } });
});
