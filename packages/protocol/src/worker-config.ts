import { z } from "zod";
import { PoolName } from "./agent.js";
import { NatsConnectionSettings } from "./connection.js";
import { ModelProvider } from "./models.js";
import { AgentPolicy } from "./policy.js";
import { SandboxBackend } from "./runtime.js";
import { durationMs, sizeBytes } from "./units.js";

const HOUR = 3_600_000;

/** The worker config file (YAML), as written. Every field is optional; flags override it. */
export const WorkerConfig = z.strictObject({
  ...NatsConnectionSettings.shape,
  prefix: z.string().min(1).optional().describe("subject and bucket prefix; --prefix overrides it"),
  pools: z.array(PoolName).min(1).optional(),
  concurrency: z.number().int().min(1).max(1024).optional().describe("jobs at once across all pools"),
  heartbeat: durationMs({ min: 100, max: HOUR }).optional(),
  idleHeartbeat: durationMs({ min: 100, max: HOUR })
    .optional()
    .describe("how often an idle worker's unchanged presence is written; default three heartbeats"),
  drainGrace: durationMs({ min: 0, max: 24 * HOUR })
    .optional()
    .describe("how long SIGTERM lets running jobs finish"),
  roomWait: durationMs({ min: 0, max: 24 * HOUR })
    .optional()
    .describe(
      "how long an attempt's artifacts, output and events wait for room while JetStream's store is full before the job fails storage_full; default 10m",
    ),
  secrets: z
    .strictObject({
      allow: z
        .array(z.string().regex(/^[A-Za-z_][A-Za-z0-9_]{0,127}$/, "must be an environment variable name"))
        .describe("variables of the worker's environment agents may be given as secrets; others are refused"),
    })
    .optional(),
  models: z
    .strictObject({
      keys: z
        .partialRecord(ModelProvider, z.string().regex(/^[A-Za-z_][A-Za-z0-9_]{0,127}$/, "must be an environment variable name"))
        .describe("for each provider, the variable of the worker's environment that holds its key (never the key itself)"),
      urls: z
        .partialRecord(ModelProvider, z.url({ protocol: /^https?$/ }))
        .optional()
        .describe("where a provider's API is, in place of its own (a proxy, a stand-in); OpenAI's with its /v1"),
      listen: z.string().min(1).optional().describe("HOST:PORT the gateway listens on; default 127.0.0.1 and a free port"),
      publicUrl: z
        .url({ protocol: /^https?$/ })
        .optional()
        .describe(
          "where sandboxes off this machine (E2B's) reach the gateway: an address of this worker's gateway that E2B's cloud can reach, TLS in front (docs/models.md#e2b-agents)",
        ),
    })
    .optional()
    .describe("the model gateway: the providers' keys this worker holds for its agents' calls (docs/models.md)"),
  dispatcherKeys: z
    .array(z.string().min(1))
    .min(1)
    .optional()
    .describe("dispatcher public keys (U...) or files of them, one per line; work items not signed by one are never run"),
  reapInterval: durationMs({ min: 100, max: 24 * HOUR })
    .optional()
    .describe("how often leftovers of crashed workers are removed"),
  usageRead: durationMs({ min: 100, max: HOUR })
    .optional()
    .describe("how often a running agent's usage file is read, so that its calls count and budgets stop as it makes them; default 10s"),
  maxLogBytes: sizeBytes({ min: 1024, max: 1024 ** 3 })
    .optional()
    .describe("agent output kept per job"),
  workRoot: z
    .string()
    .min(1)
    .optional()
    .describe(
      "where workspaces are staged on this machine; default /dev/shm where it is a tmpfs of at least 1 GiB with 512 MiB free, else the temporary folder",
    ),
  replicas: z
    .union([z.literal(1), z.literal(3), z.literal(5)])
    .optional()
    .describe("replicas of the streams and buckets, when this worker creates the system; --replicas overrides it"),
  streamLimits: z
    .strictObject({
      events: sizeBytes({ min: 1024 ** 2, max: 1024 ** 5 }).optional(),
      logs: sizeBytes({ min: 1024 ** 2, max: 1024 ** 5 }).optional(),
      dead: sizeBytes({ min: 1024 ** 2, max: 1024 ** 5 }).optional(),
      submit: sizeBytes({ min: 1024 ** 2, max: 1024 ** 5 }).optional(),
    })
    .optional()
    .describe(
      "what the history streams and the durable intake reserve when this worker creates the system, such as events: 64Mi; --stream-limits overrides it",
    ),
  logFormat: z.enum(["json", "pretty"]).optional(),
  health: z
    .string()
    .regex(/^.+:\d{1,5}$/, "must be HOST:PORT")
    .optional()
    .describe("where to serve /healthz and /readyz, such as 0.0.0.0:8080; --health overrides it"),
  metrics: z
    .string()
    .regex(/^.+:\d{1,5}$/, "must be HOST:PORT")
    .optional()
    .describe("where to serve Prometheus /metrics, such as 0.0.0.0:9464; --metrics overrides it"),
  policy: AgentPolicy.optional().describe(
    "what this worker lets agents ask for (networks, images, templates, pools, secrets, trusted, limits); a job whose agent asks for more fails unrun",
  ),
  sandbox: z
    .strictObject({
      allowed: z.array(SandboxBackend).optional().describe("backends this worker may use"),
      prefer: z.array(SandboxBackend).optional().describe("the order auto tries them in"),
      host: z.enum(["never", "trusted", "always"]).optional().describe("which agents may run unisolated on the host"),
      hostUser: z
        .string()
        .regex(/^[1-9]\d*:[1-9]\d*$/, "must be uid:gid, not root")
        .optional()
        .describe("run host agents as this user (a worker running as root), so they cannot read the worker's environment"),
      docker: z
        .strictObject({
          image: z.string().min(1).optional().describe("image for agents that name none"),
          user: z
            .string()
            .regex(/^[1-9]\d*:[1-9]\d*$/, "must be uid:gid, not root")
            .optional(),
          limits: z
            .strictObject({
              cpus: z.number().positive().max(256).optional(),
              memory: sizeBytes({ min: 6 * 1024 ** 2, max: 1024 ** 4 }).optional(),
              pids: z.number().int().min(8).max(1_000_000).optional(),
            })
            .optional()
            .describe("defaults for agents that set none"),
          tmpSize: sizeBytes({ min: 1024 ** 2, max: 64 * 1024 ** 3 }).optional(),
          maxWorkspace: sizeBytes({ min: 1024 ** 2, max: 1024 ** 4 })
            .optional()
            .describe(
              "most data in a container's workspace: watched while a bind-mounted one is written, checked as a copied one comes out",
            ),
          maxWorkspaceEntries: z
            .number()
            .int()
            .min(100)
            .max(10_000_000)
            .optional()
            .describe("most files and folders in a container's workspace, the same two ways (default 100000)"),
          workspace: z
            .enum(["auto", "bind", "copy"])
            .optional()
            .describe("how a job's workspace reaches its container: bind-mount the job's folder, or copy it in and out (default auto)"),
          warm: z
            .number()
            .int()
            .min(0)
            .max(64)
            .optional()
            .describe("containers kept started for each image and network that runtime.warm agents use (default 0: no warm pool)"),
        })
        .optional(),
      e2b: z
        .strictObject({
          apiKeyEnv: z.string().min(1).optional().describe("the environment variable that holds the API key; default E2B_API_KEY"),
          template: z.string().min(1).optional().describe("template for agents that name none"),
          domain: z.string().min(1).optional(),
          apiUrl: z.url().optional(),
          sandboxUrl: z.url().optional(),
          timeoutMargin: durationMs({ min: 0, max: HOUR }).optional().describe("added to the job's timeout for the sandbox's own"),
        })
        .optional(),
    })
    .optional(),
});
export type WorkerConfig = z.infer<typeof WorkerConfig>;
