import { expect, test } from "vitest";
import { names } from "./names.js";
import { PRIORITIES } from "./priority.js";

test("a work consumer's name gives back its pool and priority; other consumers give nothing", () => {
  const n = names("boxcar");
  for (const pool of ["default", "gpu-a", "pool-x", "high-low"]) {
    for (const priority of PRIORITIES) expect(n.poolOfConsumer(n.poolConsumer(pool, priority))).toEqual({ pool, priority });
  }
  expect(n.poolOfConsumer(n.intakeConsumer)).toBeUndefined();
});
