import { readFile } from "node:fs/promises";
import { fileURLToPath } from "node:url";
import { names, PRIORITIES, type Priority } from "@boxcar/protocol";
import { ScaledObject } from "@kubernetes-models/keda/keda.sh/v1alpha1";
import { Deployment } from "kubernetes-models/apps/v1";
import { PodDisruptionBudget } from "kubernetes-models/policy/v1";
import { Service } from "kubernetes-models/v1";
import { describe, expect, test } from "vitest";
import { parse, parseAllDocuments } from "yaml";

/** The manifests in deploy/kubernetes, checked against the Kubernetes and KEDA API schemas and against Boxcar's own names. */
const file = (name: string) => fileURLToPath(new URL(`../deploy/kubernetes/${name}`, import.meta.url));
const documents = async (name: string) =>
  parseAllDocuments(await readFile(file(name), "utf8")).map((d) => d.toJS() as { kind: string; metadata: { name: string } });
/** Every manifest of Boxcar's own (the NATS chart's values are not one). */
const MANIFESTS = ["boxcar.yaml", "keda.yaml", "worker-e2b.yaml", "ui.yaml"];
const manifests = async () => (await Promise.all(MANIFESTS.map(documents))).flat();
const deployments = async () => (await manifests()).filter((d) => d.kind === "Deployment") as unknown as Deployment[];
/** The Deployments of the roles (the dashboard is none). */
const roleDeployments = async () => (await deployments()).filter((d) => d.metadata?.labels?.["app.kubernetes.io/component"] !== "ui");
/** The Deployment of one role. */
const deployment = async (role: string) => (await deployments()).find((d) => d.metadata?.name === `boxcar-${role}`);

const MODELS: Record<string, new (value: never) => { validate(): void }> = {
  Deployment,
  PodDisruptionBudget,
  ScaledObject,
  Service,
};

describe("deploy/kubernetes", () => {
  test("every manifest is valid for its API (Deployments, PodDisruptionBudgets, KEDA ScaledObject)", async () => {
    const all = await manifests();
    expect(all.map((d) => `${d.kind}/${d.metadata.name}`).sort()).toEqual([
      "Deployment/boxcar-dispatcher",
      "Deployment/boxcar-ui",
      "Deployment/boxcar-worker",
      "Deployment/boxcar-worker-e2b",
      "PodDisruptionBudget/boxcar-dispatcher",
      "PodDisruptionBudget/boxcar-worker",
      "PodDisruptionBudget/boxcar-worker-e2b",
      "ScaledObject/boxcar-worker",
      "ScaledObject/boxcar-worker-e2b",
      "Service/boxcar-ui",
    ]);
    for (const doc of all) {
      const Model = MODELS[doc.kind];
      expect(Model, doc.kind).toBeDefined();
      expect(() => new (Model as NonNullable<typeof Model>)(doc as never).validate(), `${doc.kind}/${doc.metadata.name}`).not.toThrow();
    }
    // A broken manifest is caught: the check is not vacuous.
    const broken = { ...(all[0] as object), spec: { replicas: "two" } };
    expect(() => new Deployment(broken as never).validate()).toThrow();
  });

  test("the KEDA triggers name the stream, consumers and pool Boxcar makes for the Deployment they scale, one per priority, summed", async () => {
    const n = names();
    const scaledObjects = (await manifests()).filter((d) => d.kind === "ScaledObject") as unknown as ScaledObject[];
    expect(scaledObjects.length).toBe(2);
    for (const scaled of scaledObjects) {
      const worker = (await deployments()).find((d) => d.metadata?.name === scaled.spec?.scaleTargetRef.name);
      const args = worker?.spec?.template.spec?.containers[0]?.args ?? [];
      expect(args[0], scaled.metadata?.name).toBe("worker");
      const pool = args[args.indexOf("--pool") + 1] as string;
      const triggers = scaled.spec?.triggers ?? [];
      expect(triggers.map((t) => t.name).sort()).toEqual([...PRIORITIES].sort());
      for (const t of triggers) {
        expect(t.type).toBe("nats-jetstream");
        expect(t.metadata.stream).toBe(n.streams.work);
        expect(t.metadata.consumer).toBe(n.poolConsumer(pool, t.name as Priority));
        // The account's public key is the deployment's own (documented placeholder).
        expect(t.metadata.account).toBe("BOXCAR_ACCOUNT");
        expect(t.metadata.natsServerMonitoringEndpoint).toMatch(/:8222$/);
      }
      const formula = scaled.spec?.advanced?.scalingModifiers?.formula ?? "";
      for (const p of PRIORITIES) expect(formula).toContain(p);
      // The threshold per worker is its concurrency.
      expect(scaled.spec?.advanced?.scalingModifiers?.target).toBe(args[args.indexOf("--concurrency") + 1]);
    }
    expect((await deployment("worker"))?.spec?.template.spec?.containers[0]?.args).toContain("default");
  });

  test("the E2B-only workers mount no engine socket and no host path, take only E2B sandboxes, and read the key from a Secret", async () => {
    const pod = (await deployment("worker-e2b"))?.spec?.template.spec;
    const container = pod?.containers[0];
    const args = container?.args ?? [];
    expect(args[args.indexOf("--sandboxes") + 1]).toBe("e2b");
    expect(pod?.volumes?.map((v) => Object.keys(v).filter((k) => k !== "name"))).toEqual([["secret"]]);
    expect(container?.volumeMounts?.map((m) => m.mountPath)).toEqual(["/auth"]);
    expect(container?.env?.find((e) => e.name === "E2B_API_KEY")?.valueFrom?.secretKeyRef?.name).toBe("boxcar-e2b");
  });

  test("the NATS chart values make a three-server JetStream cluster with the monitoring port KEDA reads", async () => {
    const values = parse(await readFile(file("nats-values.yaml"), "utf8"));
    expect(values.config.cluster).toMatchObject({ enabled: true, replicas: 3 });
    expect(values.config.jetstream.enabled).toBe(true);
    expect(values.config.monitor).toMatchObject({ enabled: true, port: 8222 });
  });

  test("the worker's grace period covers its drain, and both roles read only the documented secret keys", async () => {
    for (const role of ["worker", "worker-e2b"]) {
      const worker = await deployment(role);
      const args = worker?.spec?.template.spec?.containers[0]?.args ?? [];
      const drainSeconds = Number.parseInt(args[args.indexOf("--drain-grace") + 1] ?? "", 10);
      expect(worker?.spec?.template.spec?.terminationGracePeriodSeconds, role).toBeGreaterThan(drainSeconds);
    }
    const text = await readFile(file("boxcar.yaml"), "utf8");
    const documented = ["dispatcher.creds", "worker.creds", "dispatchers.pub"];
    for (const d of await deployments()) {
      for (const arg of d?.spec?.template.spec?.containers[0]?.args ?? []) {
        if (arg.startsWith("/auth/")) expect(documented).toContain(arg.slice(6));
      }
    }
    for (const key of documented) expect(text).toContain(`--from-file=${key}=`);
  });

  test("each role serves metrics on the port its --metrics flag opens, and its pods say so to Prometheus", async () => {
    for (const d of await roleDeployments()) {
      const role = d.metadata?.name;
      const container = d.spec?.template.spec?.containers[0];
      const args = container?.args ?? [];
      const address = args[args.indexOf("--metrics") + 1] ?? "";
      expect(address, role).toMatch(/^0\.0\.0\.0:\d+$/);
      const port = Number(address.split(":").pop());
      expect(container?.ports?.find((p) => p.name === "metrics")?.containerPort, role).toBe(port);
      expect(d.spec?.template.metadata?.annotations, role).toEqual({
        "prometheus.io/scrape": "true",
        "prometheus.io/port": String(port),
        "prometheus.io/path": "/metrics",
      });
    }
  });

  test("each role's probes ask the health endpoint its --health flag opens: liveness /healthz, readiness /readyz", async () => {
    for (const d of await roleDeployments()) {
      const role = d.metadata?.name;
      const container = d.spec?.template.spec?.containers[0];
      const args = container?.args ?? [];
      const port = Number((args[args.indexOf("--health") + 1] ?? "").split(":").pop());
      expect(args[args.indexOf("--health") + 1], role).toMatch(/^0\.0\.0\.0:\d+$/);
      const named = container?.ports?.find((p) => p.name === container?.livenessProbe?.httpGet?.port);
      expect(named?.containerPort, role).toBe(port);
      expect(container?.livenessProbe?.httpGet?.path, role).toBe("/healthz");
      expect(container?.readinessProbe?.httpGet).toEqual({ path: "/readyz", port: named?.name });
    }
  });

  test("the dashboard acts as a viewer, holds only the viewer's key and the users' list, and its address is the origin NATS's WebSocket allows", async () => {
    const ui = await deployment("ui");
    const args = ui?.spec?.template.spec?.containers[0]?.args ?? [];
    const arg = (flag: string) => args[args.indexOf(flag) + 1];
    expect(arg("--as")).toBe("viewer:viewer");
    expect(arg("--nats-ws")).toMatch(/^wss:\/\//);
    const items = ui?.spec?.template.spec?.volumes?.find((v) => v.name === "auth")?.secret?.items ?? [];
    expect(items.map((i) => i.path).sort()).toEqual(["auth.json", "keys/role-viewer.nk"]);
    const values = parse(await readFile(file("nats-values.yaml"), "utf8")) as {
      config: { websocket: { enabled: boolean; merge: { allowed_origins: string[] } } };
    };
    expect(values.config.websocket.enabled).toBe(true);
    expect(values.config.websocket.merge.allowed_origins).toEqual([new URL(arg("--host-name") as string).origin]);
  });
});
