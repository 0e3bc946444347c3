/**
 * The import rules of Boxcar's packages, checked by `pnpm lint` (dependency-cruiser): no cycle
 * anywhere, no package importing one above it, and inside the worker each folder importing only
 * the folders below it. docs/architecture.md draws the same layers.
 */
const worker = (folder) => `^packages/worker/src/${folder}/`;

/**
 * The worker's folders, lowest first: each may import those before it, never those after, and
 * the worker's settings and meters (worker-options.ts, worker-metrics.ts), which every part reads.
 */
const WORKER_LAYERS = ["workspace", "sandbox", "intake", "sessions", "run"];

module.exports = {
  forbidden: [
    {
      name: "no-cycle",
      severity: "error",
      comment: "A cycle makes modules that cannot be understood, tested or moved one at a time.",
      from: {},
      to: { circular: true },
    },
    {
      name: "sdk-not-from-roles",
      severity: "error",
      comment: "The SDK (@boxcar/client) and the protocol serve users: they import no role.",
      from: { path: "^packages/(client|protocol)/" },
      to: { path: "^packages/(dispatcher|worker|cli|ui|auth)/" },
    },
    {
      name: "roles-apart",
      severity: "error",
      comment: "The dispatcher and the worker never import each other: they meet only on NATS subjects.",
      from: { path: "^packages/(dispatcher|worker)/" },
      to: { path: "^packages/(dispatcher|worker)/", pathNot: "^packages/$1/" },
    },
    ...WORKER_LAYERS.map((folder, i) => ({
      name: `worker-${folder}-imports-down`,
      severity: "error",
      comment: `packages/worker/src/${folder} imports only ${WORKER_LAYERS.slice(0, i).join(", ") || "no other folder"} of the worker (and other packages).`,
      from: { path: worker(folder) },
      to: {
        path: "^packages/worker/src/",
        pathNot: [worker(folder), ...WORKER_LAYERS.slice(0, i).map(worker), "^packages/worker/src/worker-(options|metrics)\\.ts$"],
      },
    })),
  ],
  options: {
    doNotFollow: { path: "node_modules" },
    exclude: { path: "(^|/)(dist|node_modules)/" },
    tsPreCompilationDeps: true,
    tsConfig: { fileName: "tsconfig.deps.json" },
    enhancedResolveOptions: { exportsFields: ["exports"], conditionNames: ["import", "types"] },
  },
};
