import { describe, expect, test } from "vitest";
import { globMatcher, globRoots } from "./glob.js";

describe("globMatcher", () => {
  test.each<[string, string, boolean]>([
    ["out/**", "out/a.txt", true],
    ["out/**", "out/deep/er/b.bin", true],
    ["out/**", "outside/a.txt", false],
    ["out/**", "out", false],
    ["*.md", "README.md", true],
    ["*.md", "docs/README.md", false],
    ["**/*.md", "README.md", true],
    ["**/*.md", "docs/a/README.md", true],
    ["docs/**/x.json", "docs/x.json", true],
    ["docs/**/x.json", "docs/a/b/x.json", true],
    ["docs/**/x.json", "docsx.json", false],
    ["report-?.txt", "report-1.txt", true],
    ["report-?.txt", "report-10.txt", false],
    ["a?b", "a/b", false],
    ["file.(1)+.txt", "file.(1)+.txt", true],
    ["file.txt", "fileXtxt", false],
    ["**", "any/thing/at/all", true],
    ["a**b", "a/x/b", true],
  ])("%s against %s is %s", (glob, path, expected) => {
    expect(globMatcher([glob])(path)).toBe(expected);
  });

  test("matches when any glob matches", () => {
    const matches = globMatcher(["out/**", "*.log"]);
    expect(["out/a", "run.log", "src/x.ts"].filter(matches)).toEqual(["out/a", "run.log"]);
  });
});

test("the folders a job's outputs lie under: none when a glob can match at the top", () => {
  expect(globRoots(["out/**"])).toEqual(["out"]);
  expect(globRoots(["out/**/*.txt", "out/sub/x", "reports/2024/*.md"])).toEqual(["out", "reports/2024"]);
  expect(globRoots(["a/b/c.txt", "a/*/d"])).toEqual(["a"]);
  expect(globRoots(["out/**", "report.md"])).toBeUndefined();
  expect(globRoots(["*/x"])).toBeUndefined();
  expect(globRoots(["**/*.txt"])).toBeUndefined();
});
