import { readFile } from "node:fs/promises";
import { fileURLToPath } from "node:url";
import { PRIORITIES, type Priority } from "@boxcar/protocol";
import { parseAllDocuments } from "yaml";

/**
 * KEDA's `nats-jetstream` scaler, ported line for line from its Go source, so a test can ask a real
 * nats-server exactly what KEDA asks and match the answer exactly as KEDA does. The real scaler
 * cannot run here (no Go toolchain with KEDA's modules, no Kubernetes); this is its
 * `GetMetricsAndActivity`, with the requests, the account match and the leader lookup unchanged.
 *
 * Two releases, which differ where it matters to Boxcar (github.com/kedacore/keda,
 * pkg/scalers/nats_jetstream_scaler.go):
 * - `"2.16"`: tag v2.16.1 (ce14b239e0300f388b0425aef68154d8070cd66f), as every release from 2.12
 *   (the first with `scalingModifiers`, which deploy/kubernetes/overlays/ha/keda.yaml needs)
 *   through 2.16: the account is matched by `name` only (L281, L308; v2.12.0 L297, L323), and the
 *   request is `fmt.Sprintf("%s://%s/jsz?acc=%s&consumers=true&config=true", ...)` (L383).
 * - `"2.20"`: tag v2.20.2 (68a5b5028f35b22d50597c69819ab32c4e92f21a, the same file as `main` in
 *   August 2026), as every release from 2.17 (commit b4c5bab96, "add accountID param for when an
 *   account's name and id differ", #6611): an optional `accountID` (defaulting to `account`,
 *   L149-151) is what the request asks for, and an entry matches when its `id` equals `accountID`
 *   or its `name` equals `account` (`IsAccount`, L476-478).
 *
 * nats-server 2.10 (server/monitor.go at v2.10.27, `accountDetail` L2873-2886, `Jsz` L3062-3064)
 * puts the account's JWT name in `name` and its public key in `id`, and `/jsz?acc=` selects an
 * account by public key only: with an account JWT named anything but its key, `account: <key>`
 * finds an entry whose `name` differs in 2.12-2.16, and `account: <name>` finds no entry at all.
 */

export type KedaRelease = "2.16" | "2.20";

/** A trigger's metadata, as in a ScaledObject (`natsServerMonitoringEndpoint` is `host:port`). */
export interface JetStreamTrigger {
  natsServerMonitoringEndpoint: string;
  account?: string;
  /** 2.17 and later only. */
  accountID?: string;
  stream: string;
  consumer: string;
  /** Default 0. */
  activationLagThreshold?: number;
  useHttps?: boolean;
}

/** What the scaler returns for one poll: the metric (the lag) and whether the trigger is active. */
export interface JetStreamMetric {
  lag: number;
  active: boolean;
}

interface ConsumerDetail {
  name: string;
  num_pending: number;
  num_ack_pending: number;
  cluster?: { leader?: string };
}
interface StreamDetail {
  name: string;
  state?: { last_seq?: number };
  consumer_detail?: ConsumerDetail[];
}
interface AccountDetail {
  id?: string;
  name: string;
  stream_detail?: StreamDetail[];
}
interface JszResponse {
  account_details?: AccountDetail[];
  meta_cluster?: { cluster_size?: number };
}
interface VarzResponse {
  connect_urls?: string[];
  cluster?: { urls?: string[] };
  server_name?: string;
}

/**
 * One scaler instance: like KEDA's, it keeps the leader it found between polls (`consumerLeader`,
 * `monitoringLeaderURL`), so poll it repeatedly as KEDA does every `pollingInterval`. Every HTTP
 * request it made is in `requests`, in order.
 */
export class KedaJetStreamScaler {
  readonly requests: string[] = [];
  private readonly account: string;
  private readonly accountID: string;
  private readonly monitoringURL: string;
  // NewNATSJetStreamScaler: `stream: &streamDetail{}` (v2.16.1 L129, v2.20.2 L132): an empty stream, not nil.
  private stream: StreamDetail | undefined = { name: "" };
  private consumerLeader = "";
  private monitoringLeaderURL = "";
  private clusterSize = 0;

  constructor(
    readonly release: KedaRelease,
    private readonly trigger: JetStreamTrigger,
  ) {
    if (release === "2.16") {
      // parseNATSJetStreamMetadata, v2.16.1 L136-191: `account` is required; there is no accountID.
      if (!trigger.account) throw new Error("no account given");
      if (trigger.accountID !== undefined) throw new Error("KEDA 2.16 has no accountID");
      this.account = trigger.account;
      this.accountID = trigger.account;
    } else {
      // v2.20.2 L145-151: one of them is required; accountID defaults to account.
      if (!trigger.account && !trigger.accountID) throw new Error("no account name or id given");
      this.account = trigger.account ?? "";
      this.accountID = trigger.accountID || this.account;
    }
    this.monitoringURL = this.jszURL(trigger.useHttps ? "https" : "http", trigger.natsServerMonitoringEndpoint);
  }

  /** getNATSJetStreamMonitoringURL: v2.16.1 L378-384 (as is), v2.20.2 L343-362 (url.Values: keys sorted, escaped). */
  private jszURL(scheme: string, host: string): string {
    if (this.release === "2.16") return `${scheme}://${host}/jsz?acc=${this.accountID}&consumers=true&config=true`;
    return `${scheme}://${host}/jsz?${goEncode({ acc: this.accountID, consumers: "true", config: "true" })}`;
  }

  /** `jsAccount.Name == s.metadata.account` (v2.16.1 L281, L308); `IsAccount` (v2.20.2 L476-478). */
  isAccount(a: AccountDetail): boolean {
    if (this.release === "2.16") return a.name === this.account;
    return a.id === this.accountID || a.name === this.account;
  }

  /** GetMetricsAndActivity: v2.16.1 L455-471, v2.20.2 L448-467. Throws what the scaler returns as an error. */
  async poll(): Promise<JetStreamMetric> {
    await this.getMonitoringData(this.monitoringURL);
    if (this.stream === undefined) throw new Error("stream not found");
    const lag = this.getMaxMsgLag();
    return { lag, active: lag > (this.trigger.activationLagThreshold ?? 0) };
  }

  /** getMaxMsgLag: v2.16.1 L429-438 (the stream's last sequence when the consumer is missing), v2.20.2 L422-431 (an error). */
  private getMaxMsgLag(): number {
    for (const c of this.stream?.consumer_detail ?? []) {
      if (c.name === this.trigger.consumer) return c.num_pending + c.num_ack_pending;
    }
    if (this.release === "2.16") return this.stream?.state?.last_seq ?? 0;
    throw new Error(`consumer "${this.trigger.consumer}" not found in stream "${this.trigger.stream}"`);
  }

  /** getNATSJetstreamMonitoringData: v2.16.1 L193-301, v2.20.2 L158-266 (the same but for the account match). */
  private async getMonitoringData(natsJetStreamMonitoringURL: string): Promise<void> {
    const cachedConsumerLeader = this.consumerLeader;
    const monitoringURL = this.monitoringLeaderURL !== "" ? this.monitoringLeaderURL : natsJetStreamMonitoringURL;
    let resp = await this.get<JszResponse>(monitoringURL);
    const consumerFound = this.setMonitoringData(resp, "");
    if (cachedConsumerLeader !== "" && !consumerFound) {
      // invalidateNATSJetStreamCachedMonitoringData: v2.16.1 L329-333, v2.20.2 L294-298
      this.consumerLeader = "";
      this.monitoringLeaderURL = "";
      this.stream = undefined;
    }
    if (consumerFound && cachedConsumerLeader !== "" && cachedConsumerLeader === this.consumerLeader) return;

    if (this.clusterSize > 1) {
      const server = await this.get<VarzResponse>(this.serverURL(""));
      let isNodeAdvertised = true;
      let clusterUrls = server.connect_urls ?? [];
      if (clusterUrls.length === 0) {
        isNodeAdvertised = false;
        clusterUrls = [...(server.cluster?.urls ?? [])];
      }
      for (const clusterURL of clusterUrls) {
        let node: string;
        let nodeURL: string;
        if (isNodeAdvertised) {
          // `strings.Split(clusterURL, ":")[0]`: the host, whatever the port.
          const nodeHostname = clusterURL.split(":")[0] as string;
          node = (await this.get<VarzResponse>(this.serverURL(nodeHostname))).server_name ?? "";
          nodeURL = this.nodeURL(nodeHostname);
        } else {
          node = clusterURL.split(".")[0] as string;
          const u = new URL(this.monitoringURL);
          nodeURL = `${u.protocol}//${node}.${u.host}${u.pathname}${u.search}`;
        }
        resp = await this.get<JszResponse>(nodeURL);
        for (const a of resp.account_details ?? []) {
          if (!this.isAccount(a)) continue;
          for (const s of a.stream_detail ?? []) {
            if (s.name !== this.trigger.stream) continue;
            for (const c of s.consumer_detail ?? []) {
              if (c.name === this.trigger.consumer && node === (c.cluster?.leader ?? "")) {
                this.setMonitoringData(resp, nodeURL);
                return;
              }
            }
          }
        }
      }
      throw new Error(`leader node not found for consumer ${this.trigger.consumer}`);
    }
  }

  /** setNATSJetStreamMonitoringData: v2.16.1 L303-327, v2.20.2 L268-292. */
  private setMonitoringData(resp: JszResponse, leaderURL: string): boolean {
    this.clusterSize = resp.meta_cluster?.cluster_size ?? 0;
    for (const a of resp.account_details ?? []) {
      if (!this.isAccount(a)) continue;
      for (const s of a.stream_detail ?? []) {
        if (s.name !== this.trigger.stream) continue;
        this.stream = s;
        for (const c of s.consumer_detail ?? []) {
          if (c.name === this.trigger.consumer) {
            this.consumerLeader = c.cluster?.leader ?? "";
            if (leaderURL !== "") this.monitoringLeaderURL = leaderURL;
            return true;
          }
        }
      }
    }
    return false;
  }

  /** getNATSJetStreamMonitoringServerURL: `/varz` on the node's host with the configured port (v2.16.1 L386-403, v2.20.2 L364-381). */
  private serverURL(nodeHostname: string): string {
    const u = new URL(this.monitoringURL);
    const host = nodeHostname === "" ? u.host : u.port !== "" ? `${nodeHostname}:${u.port}` : nodeHostname;
    return `${u.protocol}//${host}/varz`;
  }

  /** getNATSJetStreamMonitoringNodeURL: the same `/jsz` request on the node's host (v2.16.1 L405-418, v2.20.2 L383-403). */
  private nodeURL(nodeHostname: string): string {
    const u = new URL(this.monitoringURL);
    const host = u.port !== "" ? `${nodeHostname}:${u.port}` : nodeHostname;
    const query = this.release === "2.16" ? u.search : `?${goEncode(Object.fromEntries(u.searchParams))}`;
    return `${u.protocol}//${host}${u.pathname}${query}`;
  }

  private async get<T>(url: string): Promise<T> {
    this.requests.push(url);
    const res = await fetch(url, { signal: AbortSignal.timeout(5_000) });
    return (await res.json()) as T;
  }
}

/** Go's `url.Values.Encode`: keys sorted, `url.QueryEscape`d (the same as URLSearchParams for keys and nkeys). */
function goEncode(values: Record<string, string>): string {
  return new URLSearchParams(Object.entries(values).sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0))).toString();
}

/** Where the ScaledObjects are: the `ha` overlay's KEDA file. */
export const KEDA_YAML = "deploy/kubernetes/overlays/ha/keda.yaml";

/**
 * The triggers of the ScaledObject `scaledObject` (default `boxcar-worker`) in `KEDA_YAML`, by
 * name (one per priority), aimed at `endpoint` (`host:port`) and with `account` in place of its
 * `BOXCAR_ACCOUNT`.
 */
export async function kedaYamlTriggers(
  endpoint: string,
  account: string,
  scaledObject = "boxcar-worker",
): Promise<Record<Priority, JetStreamTrigger>> {
  const file = fileURLToPath(new URL(`../../${KEDA_YAML}`, import.meta.url));
  const docs = parseAllDocuments(await readFile(file, "utf8")).map(
    (d) =>
      d.toJS() as {
        kind: string;
        metadata: { name: string };
        spec: { triggers: { name: string; type: string; metadata: Record<string, string | undefined> }[] };
      },
  );
  const scaled = docs.find((d) => d.kind === "ScaledObject" && d.metadata.name === scaledObject);
  if (!scaled) throw new Error(`${KEDA_YAML}: no ScaledObject ${scaledObject}`);
  const out: Partial<Record<Priority, JetStreamTrigger>> = {};
  for (const t of scaled.spec.triggers) {
    if (t.type !== "nats-jetstream" || t.metadata.account !== "BOXCAR_ACCOUNT" || !t.metadata.stream || !t.metadata.consumer) {
      throw new Error(`${KEDA_YAML}: trigger ${t.name} is not the nats-jetstream trigger this helper knows`);
    }
    out[t.name as Priority] = {
      natsServerMonitoringEndpoint: endpoint,
      account,
      stream: t.metadata.stream,
      consumer: t.metadata.consumer,
      activationLagThreshold: Number(t.metadata.activationLagThreshold ?? 0),
    };
  }
  if (!PRIORITIES.every((p) => out[p])) throw new Error(`${KEDA_YAML}: no trigger for every priority (${PRIORITIES.join(", ")})`);
  return out as Record<Priority, JetStreamTrigger>;
}
