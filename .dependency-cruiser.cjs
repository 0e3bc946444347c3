/**
 * The import rules of Boxcar's packages, checked by `pnpm lint` (dependency-cruiser): no cycle
 * anywhere, no package importing one above it, and inside the dispatcher and the worker each
 * folder importing only the folders below it. docs/architecture.md draws the same layers.
 */
const folderOf = (pkg) => (folder) => `^packages/${pkg}/src/${folder}/`;

/**
 * Each role's folders, lowest first: a folder may import those before it, never those after,
 * and the role's own settings and meters at its root, which every part reads.
 */
const LAYERS = {
  worker: { folders: ["workspace", "sandbox", "gateway", "harness", "intake", "sessions", "run"], shared: "worker-(options|metrics)" },
  dispatcher: {
    folders: ["loops", "catalog", "jobs", "limits", "sessions", "intake", "retention", "sweeps", "schedules", "workflows", "api"],
    shared: "dispatcher-metrics",
  },
};

const layerRules = Object.entries(LAYERS).flatMap(([pkg, { folders, shared }]) => {
  const folder = folderOf(pkg);
  return folders.map((name, i) => ({
    name: `${pkg}-${name}-imports-down`,
    severity: "error",
    comment: `packages/${pkg}/src/${name} imports only ${folders.slice(0, i).join(", ") || "no other folder"} of the ${pkg} (and other packages).`,
    from: { path: folder(name) },
    to: {
      path: `^packages/${pkg}/src/`,
      pathNot: [folder(name), ...folders.slice(0, i).map(folder), `^packages/${pkg}/src/${shared}\\.ts$`],
    },
  }));
});

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
      name: "roles-not-from-sdk",
      severity: "error",
      comment: "The roles share a kernel (@boxcar/common) with the SDK; they do not use the SDK users import.",
      from: { path: "^packages/(dispatcher|worker|fabric)/" },
      to: { path: "^packages/client/" },
    },
    {
      name: "common-is-the-kernel",
      severity: "error",
      comment: "@boxcar/common is below every other package: it imports none of them.",
      from: { path: "^packages/common/" },
      to: { path: "^packages/", pathNot: "^packages/common/" },
    },
    {
      name: "roles-apart",
      severity: "error",
      comment: "The dispatcher and the worker never import each other: they meet only on NATS subjects.",
      from: { path: "^packages/(dispatcher|worker)/" },
      to: { path: "^packages/(dispatcher|worker)/", pathNot: "^packages/$1/" },
    },
    {
      name: "protocol-internal-for-roles",
      severity: "error",
      comment:
        "The protocol's internal entry (@boxcar/protocol/internal: the logic the roles share) is for fabric, the dispatcher and the worker; the SDK, the CLI and the dashboard use its public entry.",
      from: { path: "^packages/", pathNot: "^packages/(fabric|dispatcher|worker|protocol)/" },
      to: { path: "^packages/protocol/src/internal\\.ts$" },
    },
    {
      name: "fabric-internal-for-roles",
      severity: "error",
      comment:
        "Fabric's internal entry (@boxcar/fabric/internal: the job store, event publishing, KV and stream reading the roles share) is for the dispatcher and the worker; the CLI and the testing package use its public entry.",
      from: { path: "^packages/", pathNot: ["^packages/(fabric|dispatcher|worker)/"] },
      to: { path: "^packages/fabric/src/internal\\.ts$" },
    },
    {
      name: "fixtures-only-in-tests",
      severity: "error",
      comment:
        "The test fixtures (@boxcar/testing, and @boxcar/fabric/testing below the roles) are for tests, the bench and users' own tests: no package's code imports them.",
      from: { path: "^packages/", pathNot: ["\\.test\\.ts$", "^packages/testing/", "^packages/fabric/src/testing\\.ts$"] },
      to: { path: ["^packages/testing/", "^packages/fabric/src/testing\\.ts$"] },
    },
    {
      name: "testing-above-the-roles",
      severity: "error",
      comment:
        "@boxcar/testing starts a dispatcher and a worker: a package it depends on cannot use it, even in its tests (a cycle of packages). Their unit tests use @boxcar/fabric/testing.",
      from: { path: "^packages/(protocol|common|client|fabric|auth|dispatcher|worker)/" },
      to: { path: "^packages/testing/" },
    },
    ...layerRules,
  ],
  options: {
    doNotFollow: { path: "node_modules" },
    exclude: { path: "(^|/)(dist|node_modules)/" },
    tsPreCompilationDeps: true,
    tsConfig: { fileName: "tsconfig.deps.json" },
    enhancedResolveOptions: { exportsFields: ["exports"], conditionNames: ["import", "types"] },
  },
};
