import { expect, test } from "vitest";
import { PoolName } from "./agent.js";
import { names } from "./names.js";
import { PRIORITIES } from "./priority.js";

test("a work consumer's name gives back its pool and priority; other consumers give nothing", () => {
  const n = names("boxcar");
  for (const pool of ["default", "gpu-a", "pool-x", "high-low"]) {
    for (const priority of PRIORITIES) expect(n.poolOfConsumer(n.poolConsumer(pool, priority))).toEqual({ pool, priority });
  }
  expect(n.poolOfConsumer(n.intakeConsumer)).toBeUndefined();
});

test("a worker consumer's name gives back its worker; its subject is no pool's", () => {
  const n = names("boxcar");
  expect(n.workerOfConsumer(n.workerConsumer("w-1_a"))).toBe("w-1_a");
  expect(n.workerOfConsumer(n.poolConsumer("worker-x"))).toBeUndefined();
  expect(n.poolOfConsumer(n.workerConsumer("w-1"))).toBeUndefined();
  // Pool names are tokens of letters, digits, '-' and '_': none is `@<worker>`, so no pool consumer's filter takes these items.
  expect(n.subjects.sessionWork("high")).toBe("boxcar.work.@high");
  expect(PoolName.safeParse("@high").success).toBe(false);
});
