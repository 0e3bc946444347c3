import { configDefaults, defineConfig } from "vitest/config";

/**
 * The tests that kill servers of a three-server NATS cluster (or a whole Compose cluster) and
 * wait for it to heal. Run beside the rest on CI's two cores, they starved each other: a
 * cluster never formed, a restarted server never caught up, 200 Docker jobs did not finish in
 * time (CI, stops 26 and 27). They run after the rest, one at a time.
 */
const ALONE = ["test/chaos.test.ts", "test/compose.test.ts", "test/ride-out.test.ts"];

export default defineConfig({
  test: {
    globalSetup: ["test/helpers/bundle-cli.ts"],
    testTimeout: 60_000,
    hookTimeout: 60_000,
    projects: [
      {
        extends: true,
        test: {
          name: "suite",
          include: ["packages/*/src/**/*.test.ts", "test/**/*.test.ts"],
          exclude: [...configDefaults.exclude, ...ALONE],
          // Integration tests start real nats-servers and child processes, and spend most of
          // their time waiting on them: with 3 files at once the 2-core CI machine was 40-95%
          // busy, and the whole run took 658 s against 848 s with 2 (2026-11-29). More would
          // oversubscribe it.
          maxWorkers: 3,
          sequence: { groupOrder: 0 },
        },
      },
      {
        extends: true,
        test: { name: "alone", include: ALONE, maxWorkers: 1, sequence: { groupOrder: 1 } },
      },
    ],
  },
});
