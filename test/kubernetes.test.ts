import { execFile } from "node:child_process";
import { X509Certificate } from "node:crypto";
import { mkdir, readFile, writeFile } from "node:fs/promises";
import { join, relative } from "node:path";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";
import { AuthDir } from "@boxcar/auth";
import { names, PRIORITIES, type Priority } from "@boxcar/protocol";
import { scratch } from "@boxcar/testing";
import { ScaledObject } from "@kubernetes-models/keda/keda.sh/v1alpha1";
import { Deployment } from "kubernetes-models/apps/v1";
import { NetworkPolicy } from "kubernetes-models/networking.k8s.io/v1";
import { PodDisruptionBudget } from "kubernetes-models/policy/v1";
import { ConfigMap, Namespace, Secret, Service } from "kubernetes-models/v1";
import type { IContainer } from "kubernetes-models/v1/Container";
import type { IPodSpec } from "kubernetes-models/v1/PodSpec";
import { describe, expect, test } from "vitest";
import { parse, parseAllDocuments } from "yaml";

/**
 * deploy/kubernetes: a Kustomize base, the overlays trial and ha, and example/ (an operator's own
 * overlay on top of ha), each rendered with `kubectl kustomize` and every object checked against
 * the Kubernetes and KEDA API schemas, against Boxcar's own names, and for the hardening the
 * pods must have.
 */
const run = promisify(execFile);
const here = (path: string) => fileURLToPath(new URL(`../deploy/kubernetes/${path}`, import.meta.url));
const text = (path: string) => readFile(here(path), "utf8");

/**
 * kubectl with Kustomize 5 or newer (components, replacements): the machine's kubectl 1.32
 * bundles 5.5. Debian 12's kubernetes-client (1.20) bundles Kustomize 2.0.3, which cannot read a
 * folder as a resource: with only that, the rendering tests are skipped, or fail where
 * BOXCAR_REQUIRE_KUBECTL says they must run (CI).
 */
const kustomizeVersion = await run("kubectl", ["version", "--client", "-o", "json"]).then(
  ({ stdout }) => (JSON.parse(stdout) as { kustomizeVersion?: string }).kustomizeVersion,
  () => undefined,
);
const kustomizeReady = Number(/^v(\d+)\./.exec(kustomizeVersion ?? "")?.[1] ?? 0) >= 5;
if (!kustomizeReady && process.env.BOXCAR_REQUIRE_KUBECTL) {
  throw new Error(
    `BOXCAR_REQUIRE_KUBECTL is set, but no kubectl with Kustomize 5 or newer is on PATH (its Kustomize: ${kustomizeVersion ?? "none"})`,
  );
}

interface K8sObject {
  apiVersion: string;
  kind: string;
  metadata: { name: string; namespace?: string; labels?: Record<string, string>; annotations?: Record<string, string> };
  // biome-ignore lint/suspicious/noExplicitAny: rendered YAML, checked by the models below
  [key: string]: any;
}

const rendered = new Map<string, Promise<K8sObject[]>>();
/** `kubectl kustomize DIR`, once per folder. */
const render = (dir: string): Promise<K8sObject[]> => {
  let objects = rendered.get(dir);
  if (!objects) {
    objects = run("kubectl", ["kustomize", dir], { maxBuffer: 16 * 1024 * 1024 }).then(({ stdout }) =>
      parseAllDocuments(stdout).map((d) => d.toJS() as K8sObject),
    );
    rendered.set(dir, objects);
  }
  return objects;
};
const overlay = (name: string) => render(here(name));

/** What an operator applies: Boxcar's two overlays, and example/, an operator's overlay of ha. */
const OVERLAYS = ["overlays/trial", "overlays/ha", "example"];
/** The overlay whose NATS chart values each of OVERLAYS uses (example/ is built on ha). */
const NATS_VALUES: Record<string, string> = { "overlays/trial": "overlays/trial", "overlays/ha": "overlays/ha", example: "overlays/ha" };

const MODELS: Record<string, new (value: never) => { validate(): void }> = {
  "v1/Namespace": Namespace,
  "v1/ConfigMap": ConfigMap,
  "v1/Secret": Secret,
  "v1/Service": Service,
  "apps/v1/Deployment": Deployment,
  "policy/v1/PodDisruptionBudget": PodDisruptionBudget,
  "networking.k8s.io/v1/NetworkPolicy": NetworkPolicy,
  "keda.sh/v1alpha1/ScaledObject": ScaledObject,
};

const deployments = async (name: string) => (await overlay(name)).filter((o) => o.kind === "Deployment") as unknown as Deployment[];
const deployment = async (name: string, role: string) => (await deployments(name)).find((d) => d.metadata?.name === `boxcar-${role}`);
const component = (d: Deployment) => d.metadata?.labels?.["app.kubernetes.io/component"] ?? "";
/** The Deployments of the roles (the dashboard is none). */
const roleDeployments = async (name: string) => (await deployments(name)).filter((d) => component(d) !== "ui");
const podOf = (d: Deployment | undefined) => d?.spec?.template.spec as IPodSpec;
const arg = (args: string[], flag: string) => args[args.indexOf(flag) + 1] as string;

/** A container's arguments with `$(VAR)` expanded as the kubelet does, from its env and the rendered ConfigMaps. */
async function expandedArgs(name: string, container: IContainer): Promise<string[]> {
  const configMaps = (await overlay(name)).filter((o) => o.kind === "ConfigMap");
  const vars = new Map<string, string>();
  for (const from of container.envFrom ?? []) {
    const data = configMaps.find((c) => c.metadata.name === from.configMapRef?.name)?.data ?? {};
    for (const [k, v] of Object.entries(data)) vars.set(k, v as string);
  }
  for (const e of container.env ?? []) {
    const ref = e.valueFrom?.configMapKeyRef;
    if (e.value !== undefined) vars.set(e.name, e.value);
    else if (ref) vars.set(e.name, configMaps.find((c) => c.metadata.name === ref.name)?.data?.[ref.key]);
  }
  return (container.args ?? []).map((a) => a.replace(/\$\(([A-Z_][A-Z0-9_]*)\)/g, (_, v: string) => vars.get(v) ?? `$(${v})`));
}

/** The roles' environment as an overlay renders it. */
async function rolesEnv(name: string): Promise<Record<string, string>> {
  const ref = podOf(await deployment(name, "dispatcher")).containers[0]?.envFrom?.[0]?.configMapRef?.name;
  return (await overlay(name)).find((o) => o.kind === "ConfigMap" && o.metadata.name === ref)?.data ?? {};
}

/** The NATS chart values for an overlay: base/nats-values.yaml, then the overlay's own (helm's -f order). */
/** The chart's TLS block of one link. */
interface NatsTls {
  enabled: boolean;
  secretName?: string;
  merge?: Record<string, unknown>;
}

async function natsValues(name: string) {
  const merge = (a: unknown, b: unknown): unknown =>
    a && b && typeof a === "object" && typeof b === "object" && !Array.isArray(a) && !Array.isArray(b)
      ? Object.fromEntries(
          [...new Set([...Object.keys(a), ...Object.keys(b)])].map((k) => [
            k,
            k in b ? merge((a as Record<string, unknown>)[k], (b as Record<string, unknown>)[k]) : (a as Record<string, unknown>)[k],
          ]),
        )
      : (b ?? a);
  return merge(parse(await text("base/nats-values.yaml")), parse(await text(`${NATS_VALUES[name]}/nats-values.yaml`))) as {
    config: {
      nats?: { tls?: NatsTls };
      cluster?: { enabled: boolean; replicas: number; tls?: NatsTls };
      jetstream: { enabled: boolean };
      monitor: { enabled: boolean; port: number; tls?: NatsTls };
      websocket: { enabled: boolean; port: number; merge: { allowed_origins: string[] }; tls?: NatsTls };
    };
    tlsCA?: { enabled: boolean; secretName: string; key: string };
  };
}

/**
 * The containers that cannot run as a non-root user, and why. Every other container runs as
 * non-root with a read-only root file system, no privilege escalation, no capabilities and the
 * runtime's seccomp profile.
 */
const ROOT_EXCEPTIONS: Record<string, string> = {
  "boxcar-worker/worker":
    "holds the node's engine socket (root on the node whoever holds it; its group differs by node) and hands workspaces in the node's folder to the agents' user: CHOWN, DAC_OVERRIDE, FOWNER",
};

describe("deploy/kubernetes: the NATS chart values", () => {
  test("JetStream with the monitoring port KEDA reads, and as many servers as each overlay says", async () => {
    for (const name of OVERLAYS) {
      const values = await natsValues(name);
      expect(values.config.jetstream.enabled, name).toBe(true);
      expect(values.config.monitor, name).toMatchObject({ enabled: true, port: 8222 });
    }
    expect((await natsValues("overlays/trial")).config.cluster?.enabled).toBe(false);
    expect((await natsValues("overlays/ha")).config.cluster).toMatchObject({ enabled: true, replicas: 3 });
  });

  test("every link is TLS (clients, routes verified both ways, WebSocket, monitoring) from one Secret, and the certificate `auth init` makes names the hosts the roles and KEDA ask", async () => {
    for (const name of OVERLAYS) {
      const { config, tlsCA } = await natsValues(name);
      for (const link of [config.nats, config.cluster, config.websocket]) {
        expect(link?.tls, name).toMatchObject({ enabled: true, secretName: "boxcar-nats-tls" });
      }
      expect(config.cluster?.tls?.merge, name).toEqual({ verify: true });
      expect(config.monitor?.tls, name).toEqual({ enabled: true });
      expect(tlsCA, name).toEqual({ enabled: true, secretName: "boxcar-nats-tls", key: "ca.crt" });
    }
    const header = await text("base/kustomization.yaml");
    for (const key of ["tls.crt=DIR/tls/server.pem", "tls.key=DIR/tls/server-key.pem", "ca.crt=DIR/tls/ca.pem"]) {
      expect(header).toContain(`--from-file=${key}`);
    }
    await using dir = await scratch("boxcar-k8s-tls-");
    const auth = await AuthDir.init(join(dir.path, "auth"));
    const cert = new X509Certificate(await readFile(join(auth.dir, "tls", "server.pem")));
    // The roles' URL, KEDA's endpoint and the servers it then asks by name, the routes between them.
    const hosts = [
      "nats",
      "nats-headless.boxcar.svc.cluster.local",
      "nats-1.nats-headless.boxcar.svc.cluster.local",
      "nats-1.nats-headless",
    ];
    for (const host of hosts) expect(cert.checkHost(host), host).toBeDefined();
  });

  test("the servers run unprivileged, and the chart's nats-box (which holds none of Boxcar's credentials) is off", async () => {
    const values = parse(await text("base/nats-values.yaml"));
    expect(values.podTemplate.merge.spec.securityContext).toMatchObject({ runAsNonRoot: true, seccompProfile: { type: "RuntimeDefault" } });
    for (const c of [values.container, values.reloader]) {
      expect(c.merge.securityContext).toEqual({
        allowPrivilegeEscalation: false,
        readOnlyRootFilesystem: true,
        capabilities: { drop: ["ALL"] },
      });
    }
    expect(values.container.resources.limits).toEqual({ cpu: expect.any(String), memory: expect.any(String) });
    expect(values.natsBox.enabled).toBe(false);
  });
});

describe.skipIf(!kustomizeReady)("deploy/kubernetes, rendered with kubectl kustomize", () => {
  test("every overlay renders, and every object is valid for its API and in the overlay's namespace", async () => {
    const kinds = (objects: K8sObject[]) =>
      objects.map((o) => `${o.kind}/${o.metadata.name.replace(/^(boxcar-(roles|ui))-[a-z0-9]{10}$/, "$1-HASH")}`).sort();
    const trial = [
      "ConfigMap/boxcar-roles-HASH",
      "ConfigMap/boxcar-ui-HASH",
      "Deployment/boxcar-dispatcher",
      "Deployment/boxcar-ui",
      "Deployment/boxcar-worker",
      "Namespace/boxcar",
      "NetworkPolicy/boxcar-default-deny",
      "NetworkPolicy/boxcar-dns",
      "NetworkPolicy/boxcar-roles",
      "NetworkPolicy/boxcar-ui",
      "NetworkPolicy/nats",
      "PodDisruptionBudget/boxcar-dispatcher",
      "PodDisruptionBudget/boxcar-worker",
      "Service/boxcar-ui",
    ];
    const ha = [
      ...trial,
      "Deployment/boxcar-worker-e2b",
      "NetworkPolicy/boxcar-worker-e2b",
      "PodDisruptionBudget/boxcar-worker-e2b",
      "ScaledObject/boxcar-worker",
      "ScaledObject/boxcar-worker-e2b",
    ].sort();
    expect(kinds(await overlay("overlays/trial"))).toEqual(trial);
    expect(kinds(await overlay("overlays/ha"))).toEqual(ha);
    expect(kinds(await overlay("example")).map((k) => k.replace("Namespace/acme-boxcar", "Namespace/boxcar"))).toEqual(ha);
    for (const name of OVERLAYS) {
      const all = await overlay(name);
      const namespaces = all.filter((o) => o.kind === "Namespace");
      expect(namespaces.length, name).toBe(1);
      for (const o of all) {
        const Model = MODELS[`${o.apiVersion}/${o.kind}`];
        expect(Model, `${name}: ${o.apiVersion} ${o.kind}`).toBeDefined();
        expect(
          () => new (Model as NonNullable<typeof Model>)(o as never).validate(),
          `${name}: ${o.kind}/${o.metadata.name}`,
        ).not.toThrow();
        if (o.kind !== "Namespace")
          expect(o.metadata.namespace, `${name}: ${o.kind}/${o.metadata.name}`).toBe(namespaces[0]?.metadata.name);
      }
    }
    expect((await overlay("example")).find((o) => o.kind === "Namespace")?.metadata.name).toBe("acme-boxcar");
    // A broken object is caught: the check is not vacuous.
    const broken = { ...((await deployments("overlays/trial"))[0] as object), spec: { replicas: "two" } };
    expect(() => new Deployment(broken as never).validate()).toThrow();
    const badPolicy = {
      ...((await overlay("overlays/trial")).find((o) => o.kind === "NetworkPolicy") as object),
      spec: { policyTypes: "Ingress" },
    };
    expect(() => new NetworkPolicy(badPolicy as never).validate()).toThrow();
  });

  test("the overlays take the image from a registry at Boxcar's version, never :latest, and an overlay of yours renames it", async () => {
    const { version } = JSON.parse(await readFile(fileURLToPath(new URL("../packages/cli/package.json", import.meta.url)), "utf8")) as {
      version: string;
    };
    const images = async (name: string) =>
      new Set((await deployments(name)).flatMap((d) => [...(podOf(d).initContainers ?? []), ...podOf(d).containers].map((c) => c.image)));
    expect(await images("overlays/trial")).toEqual(new Set([`registry.example.com/boxcar-worker:${version}`]));
    expect(await images("overlays/ha")).toEqual(new Set([`registry.example.com/boxcar-worker:${version}`]));
    expect(await images("example")).toEqual(new Set(["registry.acme.example/platform/boxcar-worker:0.1.0"]));
  });

  test("each overlay's roles ask for as many replicas as its NATS servers, and reach them at the chart's service", async () => {
    for (const name of OVERLAYS) {
      const cluster = (await natsValues(name)).config.cluster;
      const servers = cluster?.enabled ? cluster.replicas : 1;
      expect(await rolesEnv(name), name).toEqual({
        BOXCAR_NATS_URL: "tls://nats:4222",
        NATS_CA: "/auth/ca.pem",
        BOXCAR_REPLICAS: String(servers),
      });
    }
    const replicas = async (name: string) =>
      Object.fromEntries((await deployments(name)).map((d) => [d.metadata?.name, d.spec?.replicas ?? "KEDA"]));
    expect(await replicas("overlays/trial")).toEqual({ "boxcar-dispatcher": 1, "boxcar-worker": 1, "boxcar-ui": 1 });
    // KEDA owns the workers' replicas: an apply must not reset them.
    expect(await replicas("overlays/ha")).toEqual({
      "boxcar-dispatcher": 2,
      "boxcar-worker": "KEDA",
      "boxcar-worker-e2b": "KEDA",
      "boxcar-ui": 1,
    });
    expect(await replicas("example")).toEqual({
      "boxcar-dispatcher": 3,
      "boxcar-worker": "KEDA",
      "boxcar-worker-e2b": "KEDA",
      "boxcar-ui": 1,
    });
  });

  test("every container runs hardened (non-root, read-only, no capabilities, RuntimeDefault seccomp, CPU and memory limits), the listed exception apart", async () => {
    const dockerfile = await readFile(fileURLToPath(new URL("../Dockerfile.worker", import.meta.url)), "utf8");
    const imageUser = /^USER (\d+):(\d+)$/m.exec(dockerfile);
    expect(imageUser?.[1], "Dockerfile.worker runs as a numeric non-root user").not.toBe("0");
    const seen = new Set<string>();
    for (const name of OVERLAYS) {
      for (const d of await deployments(name)) {
        const pod = podOf(d);
        expect(pod.automountServiceAccountToken, `${name}: ${d.metadata?.name}`).toBe(false);
        for (const c of [...(pod.initContainers ?? []), ...pod.containers]) {
          const where = `${name}: ${d.metadata?.name}/${c.name}`;
          const key = `${d.metadata?.name}/${c.name}`;
          seen.add(key);
          const sc = c.securityContext ?? {};
          expect(c.resources?.requests, where).toEqual({ cpu: expect.any(String), memory: expect.any(String) });
          expect(c.resources?.limits, where).toEqual({ cpu: expect.any(String), memory: expect.any(String) });
          expect(sc.allowPrivilegeEscalation, where).toBe(false);
          expect(sc.readOnlyRootFilesystem, where).toBe(true);
          expect(sc.capabilities?.drop, where).toEqual(["ALL"]);
          expect(sc.seccompProfile ?? pod.securityContext?.seccompProfile, where).toEqual({ type: "RuntimeDefault" });
          if (key in ROOT_EXCEPTIONS) {
            expect(sc.runAsUser, where).toBe(0);
            expect(sc.runAsNonRoot, where).toBe(false);
            expect(sc.capabilities?.add, where).toEqual(["CHOWN", "DAC_OVERRIDE", "FOWNER"]);
          } else {
            expect(sc.runAsNonRoot, where).toBe(true);
            expect(sc.capabilities?.add, where).toBeUndefined();
            expect(sc.privileged, where).toBeUndefined();
            // The image's own user, whose group the mounted Secrets are given to.
            expect(pod.securityContext, where).toMatchObject({
              runAsNonRoot: true,
              runAsUser: Number(imageUser?.[1]),
              runAsGroup: Number(imageUser?.[2]),
              fsGroup: Number(imageUser?.[2]),
            });
            expect(pod.volumes?.filter((v) => v.hostPath) ?? [], where).toEqual([]);
          }
        }
      }
    }
    // Every exception is still needed, and is the only one.
    for (const key of Object.keys(ROOT_EXCEPTIONS)) expect(seen).toContain(key);
  });

  test("every Deployment but the dashboard (one process by design) has a PodDisruptionBudget letting one pod go at a time", async () => {
    for (const name of OVERLAYS) {
      const budgets = (await overlay(name)).filter((o) => o.kind === "PodDisruptionBudget") as unknown as PodDisruptionBudget[];
      for (const d of await deployments(name)) {
        const pdb = budgets.find((b) => JSON.stringify(b.spec?.selector) === JSON.stringify(d.spec?.selector));
        if (component(d) === "ui") expect(pdb, `${name}: ${d.metadata?.name}`).toBeUndefined();
        else expect(pdb?.spec?.maxUnavailable, `${name}: ${d.metadata?.name}`).toBe(1);
      }
    }
  });

  test("the KEDA triggers name the stream, consumers and pool Boxcar makes for the Deployment they scale, one per priority, summed", async () => {
    const n = names();
    expect((await overlay("overlays/trial")).filter((o) => o.kind === "ScaledObject")).toEqual([]);
    for (const name of ["overlays/ha", "example"]) {
      const namespace = (await overlay(name)).find((o) => o.kind === "Namespace")?.metadata.name;
      const scaledObjects = (await overlay(name)).filter((o) => o.kind === "ScaledObject") as unknown as ScaledObject[];
      expect(scaledObjects.length).toBe(2);
      for (const scaled of scaledObjects) {
        const worker = (await deployments(name)).find((d) => d.metadata?.name === scaled.spec?.scaleTargetRef.name);
        const args = podOf(worker).containers[0]?.args ?? [];
        expect(args[0], scaled.metadata?.name).toBe("worker");
        const pool = arg(args, "--pool");
        const triggers = scaled.spec?.triggers ?? [];
        expect(triggers.map((t) => t.name).sort()).toEqual([...PRIORITIES].sort());
        for (const t of triggers) {
          expect(t.type).toBe("nats-jetstream");
          expect(t.metadata.stream).toBe(n.streams.work);
          expect(t.metadata.consumer).toBe(n.poolConsumer(pool, t.name as Priority));
          // The chart's headless service in the overlay's namespace, on the monitoring port.
          expect(t.metadata.natsServerMonitoringEndpoint).toBe(`nats-headless.${namespace}.svc.cluster.local:8222`);
          expect(t.metadata.useHttps).toBe("true");
        }
        const formula = scaled.spec?.advanced?.scalingModifiers?.formula ?? "";
        for (const p of PRIORITIES) expect(formula).toContain(p);
        // The threshold per worker is its concurrency.
        expect(scaled.spec?.advanced?.scalingModifiers?.target).toBe(arg(args, "--concurrency"));
      }
    }
    expect(podOf(await deployment("overlays/ha", "worker")).containers[0]?.args).toContain("default");
    // The account's public key is the deployment's own: a placeholder in ha, an operator's overlay gives it.
    const accounts = async (name: string) =>
      new Set(
        ((await overlay(name)).filter((o) => o.kind === "ScaledObject") as unknown as ScaledObject[]).flatMap((s) =>
          (s.spec?.triggers ?? []).map((t) => t.metadata.account),
        ),
      );
    expect(await accounts("overlays/ha")).toEqual(new Set(["BOXCAR_ACCOUNT"]));
    const given = /account=(A[A-Z2-7]{55})/.exec(await text("example/kustomization.yaml"))?.[1];
    expect(await accounts("example")).toEqual(new Set([given]));
    // The ConfigMap it came from is read by Kustomize, never applied.
    expect((await overlay("example")).filter((o) => o.metadata.name.startsWith("boxcar-site"))).toEqual([]);
  });

  test("the E2B-only workers mount no engine socket and no host path, take only E2B sandboxes, and read the key from a Secret", async () => {
    for (const name of ["overlays/ha", "example"]) {
      const pod = podOf(await deployment(name, "worker-e2b"));
      const container = pod.containers[0];
      const args = container?.args ?? [];
      expect(arg(args, "--sandboxes")).toBe("e2b");
      expect(arg(args, "--pool")).toBe("e2b");
      expect(pod.volumes?.map((v) => Object.keys(v).filter((k) => k !== "name"))).toEqual([["secret"], ["emptyDir"]]);
      expect(container?.volumeMounts?.map((m) => m.mountPath)).toEqual(["/auth", "/tmp"]);
      expect(container?.env?.find((e) => e.name === "E2B_API_KEY")?.valueFrom?.secretKeyRef).toEqual({
        name: "boxcar-e2b",
        key: "api-key",
      });
    }
  });

  test("the workers' grace periods cover their drain, and each pod mounts only the secret keys it reads, all of them documented", async () => {
    const header = await text("base/kustomization.yaml");
    for (const name of OVERLAYS) {
      for (const d of await roleDeployments(name)) {
        const where = `${name}: ${d.metadata?.name}`;
        const pod = podOf(d);
        const args = pod.containers[0]?.args ?? [];
        if (args[0] === "worker") {
          const drainSeconds = Number.parseInt(arg(args, "--drain-grace"), 10);
          expect(pod.terminationGracePeriodSeconds, where).toBeGreaterThan(drainSeconds);
        }
        // The files its arguments name under /auth are exactly the Secret's items.
        const items = pod.volumes?.find((v) => v.name === "auth")?.secret?.items ?? [];
        const read = [...args, ...Object.values(await rolesEnv(name))]
          .filter((a) => a.startsWith("/auth/"))
          .map((a) => a.slice("/auth/".length));
        expect(items.map((i) => i.path).sort(), where).toEqual(read.sort());
        for (const i of items) expect(header, where).toContain(`--from-file=${i.key}=`);
      }
      const ui = podOf(await deployment(name, "ui"));
      const items = ui.volumes?.find((v) => v.name === "auth")?.secret?.items ?? [];
      expect(items.map((i) => i.path).sort()).toEqual(["auth.json", "keys/role-viewer.nk"]);
      for (const i of items) expect(header).toContain(`--from-file=${i.key}=`);
      // Every Secret a pod names is one the header says how to make; every ConfigMap is rendered.
      const objects = await overlay(name);
      for (const d of await deployments(name)) {
        const pod = podOf(d);
        const secrets = [
          ...(pod.volumes ?? []).flatMap((v) => (v.secret?.secretName ? [v.secret.secretName] : [])),
          ...pod.containers.flatMap((c) =>
            (c.env ?? []).flatMap((e) => (e.valueFrom?.secretKeyRef ? [e.valueFrom.secretKeyRef.name] : [])),
          ),
        ];
        for (const s of secrets) expect(header, `${name}: ${d.metadata?.name}`).toContain(`create secret generic ${s} `);
        const configMaps = pod.containers.flatMap((c) => [
          ...(c.envFrom ?? []).flatMap((f) => (f.configMapRef ? [f.configMapRef.name] : [])),
          ...(c.env ?? []).flatMap((e) => (e.valueFrom?.configMapKeyRef ? [e.valueFrom.configMapKeyRef.name] : [])),
        ]);
        for (const c of configMaps)
          expect(
            objects.some((o) => o.kind === "ConfigMap" && o.metadata.name === c),
            `${name}: ${c}`,
          ).toBe(true);
      }
    }
  });

  test("each role serves metrics on the port its --metrics flag opens, and its pods say so to Prometheus", async () => {
    for (const name of OVERLAYS) {
      for (const d of await roleDeployments(name)) {
        const role = `${name}: ${d.metadata?.name}`;
        const container = podOf(d).containers[0];
        const address = arg(container?.args ?? [], "--metrics");
        expect(address, role).toMatch(/^0\.0\.0\.0:\d+$/);
        const port = Number(address.split(":").pop());
        expect(container?.ports?.find((p) => p.name === "metrics")?.containerPort, role).toBe(port);
        expect(d.spec?.template.metadata?.annotations, role).toEqual({
          "prometheus.io/scrape": "true",
          "prometheus.io/port": String(port),
          "prometheus.io/path": "/metrics",
        });
      }
    }
  });

  test("each role's probes ask the health endpoint its --health flag opens (liveness /healthz, readiness /readyz); the dashboard's both ask its page", async () => {
    for (const name of OVERLAYS) {
      for (const d of await roleDeployments(name)) {
        const role = `${name}: ${d.metadata?.name}`;
        const container = podOf(d).containers[0];
        const address = arg(container?.args ?? [], "--health");
        expect(address, role).toMatch(/^0\.0\.0\.0:\d+$/);
        const named = container?.ports?.find((p) => p.name === container?.livenessProbe?.httpGet?.port);
        expect(named?.containerPort, role).toBe(Number(address.split(":").pop()));
        expect(container?.livenessProbe?.httpGet?.path, role).toBe("/healthz");
        expect(container?.readinessProbe?.httpGet).toEqual({ path: "/readyz", port: named?.name });
      }
      const ui = podOf(await deployment(name, "ui")).containers[0] as IContainer;
      const listen = arg(ui.args ?? [], "--listen");
      const port = ui.ports?.find((p) => p.name === "http");
      expect(port?.containerPort).toBe(Number(listen.split(":").pop()));
      for (const probe of [ui.readinessProbe, ui.livenessProbe]) {
        // The server answers only the hosts it knows: 127.0.0.1 on its port is one.
        expect(probe?.httpGet).toEqual({
          path: "/",
          port: "http",
          httpHeaders: [{ name: "Host", value: `127.0.0.1:${port?.containerPort}` }],
        });
      }
    }
  });

  test("the dashboard acts as a viewer, its addresses come from the overlay, and its own is the origin NATS's WebSocket allows", async () => {
    for (const name of OVERLAYS) {
      const ui = podOf(await deployment(name, "ui")).containers[0] as IContainer;
      const args = await expandedArgs(name, ui);
      expect(arg(args, "--as")).toBe("viewer:viewer");
      expect(arg(args, "--nats-ws")).toMatch(/^wss:\/\//);
      expect(arg(args, "--host-name")).toMatch(/^https:\/\//);
      if (name !== "example") {
        const values = await natsValues(name);
        expect(values.config.websocket.enabled).toBe(true);
        expect(values.config.websocket.merge.allowed_origins).toEqual([new URL(arg(args, "--host-name")).origin]);
      }
    }
    const example = await expandedArgs("example", podOf(await deployment("example", "ui")).containers[0] as IContainer);
    expect([arg(example, "--nats-ws"), arg(example, "--host-name")]).toEqual(["wss://nats-ws.acme.example", "https://boxcar.acme.example"]);
  });

  test("the network policies: all denied but the roles to NATS, the dashboard on its port, NATS from the roles, its peers, browsers and KEDA", async () => {
    type Policy = NetworkPolicy & { spec: NonNullable<NetworkPolicy["spec"]> };
    type Selector = { matchLabels?: Record<string, string>; matchExpressions?: { key: string; operator: string; values?: string[] }[] };
    const matches = (selector: Selector | undefined, labels: Record<string, string>) =>
      selector !== undefined &&
      Object.entries(selector.matchLabels ?? {}).every(([k, v]) => labels[k] === v) &&
      (selector.matchExpressions ?? []).every((e) => e.operator === "In" && e.values?.includes(labels[e.key] as string));
    const NATS_POD = { "app.kubernetes.io/name": "nats", "app.kubernetes.io/instance": "nats", "app.kubernetes.io/component": "nats" };
    /** What may reach a pod with `labels` (ingress), or what it may reach (egress), as "PORT/PROTOCOL PEER" lines. */
    const allowed = (policies: Policy[], labels: Record<string, string>, direction: "egress" | "ingress") =>
      policies
        .filter((p) => matches(p.spec.podSelector, labels))
        .flatMap((p) =>
          (p.spec[direction] ?? []).flatMap((rule) => {
            const { to, from, ports } = rule as { to?: Peer[]; from?: Peer[]; ports?: { port?: number | string; protocol?: string }[] };
            const peers = to ?? from ?? [];
            const whom = peers.length === 0 ? ["anywhere"] : peers.map(peerName);
            return (ports ?? []).flatMap((port) => whom.map((w) => `${port.port}/${port.protocol} ${w}`));
          }),
        )
        .sort();
    type Peer = { ipBlock?: { cidr: string; except?: string[] }; namespaceSelector?: Selector; podSelector?: Selector };
    const values = (selector: Selector | undefined) =>
      [...Object.values(selector?.matchLabels ?? {}), ...(selector?.matchExpressions ?? []).flatMap((e) => e.values ?? [])].join("+");
    const peerName = (peer: Peer): string => {
      if (peer.ipBlock) return `ipBlock ${peer.ipBlock.cidr} except ${(peer.ipBlock.except ?? []).length}`;
      if (peer.namespaceSelector && peer.podSelector) return `${values(peer.namespaceSelector)}/${values(peer.podSelector)}`;
      if (peer.namespaceSelector)
        return values(peer.namespaceSelector) === "" ? "any namespace" : `namespace ${values(peer.namespaceSelector)}`;
      if (matches(peer.podSelector, NATS_POD)) return "nats";
      return `pods ${values(peer.podSelector)}`;
    };
    for (const name of OVERLAYS) {
      const policies = (await overlay(name)).filter((o) => o.kind === "NetworkPolicy") as unknown as Policy[];
      // A default deny covering every pod of the namespace, both ways.
      expect(
        policies.some(
          (p) =>
            JSON.stringify(p.spec.podSelector) === "{}" &&
            p.spec.policyTypes?.join() === "Ingress,Egress" &&
            !p.spec.ingress &&
            !p.spec.egress,
        ),
      ).toBe(true);
      const dns = ["53/TCP kube-system/kube-dns", "53/UDP kube-system/kube-dns"];
      for (const d of await deployments(name)) {
        const labels = d.spec?.template.metadata?.labels ?? {};
        const role = component(d);
        const where = `${name}: ${d.metadata?.name}`;
        const egress = allowed(policies, labels, "egress");
        const ingress = allowed(policies, labels, "ingress");
        if (role === "ui") {
          expect(egress, where).toEqual(dns);
          expect(ingress, where).toEqual(["4280/TCP anywhere"]);
          continue;
        }
        const internet = role === "worker-e2b" ? ["443/TCP ipBlock 0.0.0.0/0 except 6", "443/TCP ipBlock ::/0 except 3"] : [];
        expect(egress, where).toEqual([...internet, "4222/TCP nats", ...dns].sort());
        const metrics = arg(podOf(d).containers[0]?.args ?? [], "--metrics")
          .split(":")
          .pop();
        expect(ingress, where).toEqual([`${metrics}/TCP any namespace`]);
        // And NATS lets this role in on its client port.
        const nats = policies.filter((p) => matches(p.spec.podSelector, NATS_POD)).flatMap((p) => p.spec.ingress ?? []);
        expect(
          nats.some((r) => r.ports?.some((p) => p.port === 4222) && r.from?.some((f) => matches(f.podSelector, labels))),
          where,
        ).toBe(true);
      }
      // The E2B workers' internet leaves out the cloud's metadata service and the private ranges.
      const e2b = policies.find((p) => p.metadata?.name === "boxcar-worker-e2b")?.spec.egress?.[0]?.to?.[0]?.ipBlock?.except ?? [];
      if (name !== "overlays/trial")
        expect(e2b).toEqual(expect.arrayContaining(["169.254.0.0/16", "10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16"]));
      const values = await natsValues(name);
      expect(allowed(policies, NATS_POD, "ingress"), name).toEqual(
        [
          "4222/TCP pods boxcar+dispatcher+worker+worker-e2b",
          `${values.config.monitor.port}/TCP namespace keda`,
          "6222/TCP nats",
          `${values.config.websocket.port}/TCP anywhere`,
        ].sort(),
      );
      expect(allowed(policies, NATS_POD, "egress"), name).toEqual([...dns, "6222/TCP nats"]);
    }
  });

  test("an overlay of yours can make the Secrets under the names the pods use", async () => {
    await using dir = await scratch("boxcar-kustomize-");
    const site = join(dir.path, "site");
    await mkdir(site);
    await writeFile(
      join(site, "kustomization.yaml"),
      [
        // Generated objects get a namespace only from the overlay that makes them.
        "namespace: boxcar",
        "resources:",
        `  - ${relative(site, here("overlays/trial"))}`,
        "secretGenerator:",
        "  - name: boxcar-auth",
        "    literals: [dispatcher.creds=d, worker.creds=w, dispatchers.pub=p]",
        "    options: { disableNameSuffixHash: true }",
        "",
      ].join("\n"),
    );
    const objects = await render(site);
    const secret = objects.find((o) => o.kind === "Secret");
    expect(secret?.metadata).toMatchObject({ name: "boxcar-auth", namespace: "boxcar" });
    expect(() => new Secret(secret as never).validate()).not.toThrow();
    const named = (objects.filter((o) => o.kind === "Deployment") as unknown as Deployment[]).flatMap((d) =>
      (podOf(d).volumes ?? []).flatMap((v) => (v.secret ? [v.secret.secretName] : [])),
    );
    expect(named.filter((n) => n === "boxcar-auth").length).toBe(2);
  });
});
