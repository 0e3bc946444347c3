#!/usr/bin/env node
/**
 * The CLI's entry. A command that answers and exits runs from the bundle this file heads
 * (`bin/bundle.ts`: it starts faster). One that runs a role (`up`, `dispatcher`, `worker`, `ui`)
 * runs from the compiled modules the role packages share: through the bundle it would hold a
 * second copy of the protocol, zod and the client (`boxcar up`: 141 MB resident against 100-107
 * MB, docs/benchmarks.md "CLI start"). Run without the bundle, both load the same module.
 */
const ROLES = ["up", "dispatcher", "worker", "ui"];

if (ROLES.includes(process.argv[2] ?? "")) {
  // A path the bundler leaves alone: from the bundle's folder, the compiled module beside this one's source.
  await import(new URL("../bin/cli.js", import.meta.url).href);
} else {
  await import("./cli.js");
}
