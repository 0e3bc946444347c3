/**
 * Bundles the CLI into `dist/bundle/` (`boxcar.js` and the chunks each command loads), which
 * `bin/boxcar` runs: one file read where Node resolved and compiled some 340 modules for `boxcar
 * jobs` (docs/benchmarks.md, "CLI start"). Run by `pnpm run build` after `tsc -b`, from what
 * `tsc` wrote.
 *
 * Bundled: the CLI, the client and what every command that talks to the system loads (the
 * protocol, zod, yaml, OpenTelemetry's API). Everything else is loaded from `node_modules` as
 * before, one copy for all: the role packages (dispatcher, worker, dashboard, auth, fabric) and
 * what only they use, and nats.js, whose connection the CLI hands to them. A BoxcarError made
 * by a role's copy of the protocol is still `instanceof BoxcarError` here.
 */

import { rm } from "node:fs/promises";
import { fileURLToPath } from "node:url";
import { build, type Plugin } from "esbuild";

/** The packages bundled in; any other bare import stays an import. */
const BUNDLED = ["@boxcar/client", "@boxcar/common", "@boxcar/protocol", "zod", "yaml", "@opentelemetry/api"];

const dist = fileURLToPath(new URL("../", import.meta.url));

const onlyBundled: Plugin = {
  name: "only-bundled",
  setup(b) {
    b.onResolve({ filter: /^[^./]/ }, (args) => {
      if (args.path.startsWith("node:")) return { path: args.path, external: true };
      const bundled = BUNDLED.some((name) => args.path === name || args.path.startsWith(`${name}/`));
      return bundled ? undefined : { path: args.path, external: true };
    });
  },
};

// Chunks are named by their content: the last build's would pile up.
await rm(`${dist}bundle`, { recursive: true, force: true });
await build({
  entryPoints: [`${dist}bin/boxcar.js`],
  outdir: `${dist}bundle`,
  bundle: true,
  splitting: true,
  format: "esm",
  platform: "node",
  target: "node20",
  plugins: [onlyBundled],
  // CommonJS packages bundled in (yaml) call `require`, which an ES module has not.
  banner: { js: 'import { createRequire as bundleRequire } from "node:module"; const require = bundleRequire(import.meta.url);' },
  logLevel: "warning",
});
