import { createHash, randomBytes } from "node:crypto";
import { chmod, rm } from "node:fs/promises";
import {
  createServer,
  Agent as HttpAgent,
  request as httpRequest,
  type IncomingMessage,
  type Server,
  type ServerResponse,
} from "node:http";
import { Agent as HttpsAgent, request as httpsRequest } from "node:https";
import type { AddressInfo } from "node:net";
import { failSpan, type Logger, SpanKind, startSpan } from "@boxcar/common";
import type { GatewayReach, ModelCall, ModelProvider, Usage } from "@boxcar/protocol";
import { addUsage, NO_USAGE } from "@boxcar/protocol/internal";
import { MAX_METERED_BODY, MAX_RECORDED_BODY, parseRequest, readBody, UsageChunkFilter } from "./bodies.js";
import type { CallLimiter } from "./call-limits.js";
import { type Metered, meterJson, SseMeter } from "./meter.js";
import { PROVIDER_WIRES, routeOf } from "./providers.js";

/**
 * The model gateway (docs/models.md): an HTTP server in the worker that agents call in place of
 * their model providers. It speaks each provider's own API (it forwards requests and answers as
 * they are, streams included), so the official SDKs work against it unchanged, pointed at it by
 * their base-URL variables. The agent holds a token valid for its attempt only; the gateway holds
 * the providers' keys, puts the right one on each forwarded request, and meters every call from
 * the provider's answer (its usage, whether the answer is one JSON body or a stream of events).
 */

/** A provider's key and, for a stand-in or a proxy, where its API is (default: the provider's own). */
export interface ProviderAccess {
  key: string;
  baseUrl?: string;
}

export interface GatewayOptions {
  /** Where it listens: host agents reach it there. Default 127.0.0.1, a free port. */
  host?: string;
  port?: number;
  providers: Partial<Record<ModelProvider, ProviderAccess>>;
  /** The largest request body forwarded, in bytes (default 32 MiB). */
  maxRequestBytes?: number;
  /**
   * Where sandboxes off this machine (E2B's) reach it: an address the operator exposes (TLS in
   * front). Absent: such sandboxes cannot reach it.
   */
  publicUrl?: string;
}

/** What the gateway knows of one attempt: the job, the providers its agent may call, and where its calls are reported. */
export interface AttemptAccess {
  jobId: string;
  attempt: number;
  providers: readonly ModelProvider[];
  /** The attempt's trace context: each call is a span of its trace. */
  traceparent?: string;
  /** Told of each call once its answer ended (or broke off). */
  onCall(call: ModelCall): void;
  /** Where the job's calls are recorded, for an agent that asks (`models.record`); absent: none. */
  recorder?: CallRecorder;
  /** What a call cost (the system policy's prices); absent: nothing. */
  price?(call: ModelCall): number;
  /** The fleet's limits on model calls (the system policy's `modelLimits`); absent: none. */
  limiter?: CallLimiter;
  /** Why a call may not be made (a budget that stops is spent), or undefined when it may; absent: no such budget. */
  spentBudget?(): Promise<string | undefined>;
}

/** A provider's answer as recorded: enough to give it again. */
export interface RecordedAnswer {
  status: number;
  headers: Record<string, string>;
  body: Buffer;
}

/**
 * A job's recorded calls, by their place in an attempt's sequence (from 1) and the hash of what
 * was asked (`requestHash`): the gateway asks it before it calls the provider, and records a
 * provider's successful answer.
 */
export interface CallRecorder {
  replay(position: number, hash: string): Promise<RecordedAnswer | undefined>;
  record(position: number, hash: string, answer: RecordedAnswer): Promise<void>;
}

/** What makes two requests the same: the provider, the endpoint and the body as forwarded, byte for byte. */
export function requestHash(provider: ModelProvider, endpoint: string, body: Buffer): string {
  return createHash("sha256").update(`${provider}\n${endpoint}\n`).update(body).digest("hex");
}

/** One attempt's way through the gateway: the variables its agent gets, and what its calls used. */
export interface GatewayPass {
  /** The SDKs' base URLs and the token, plus BOXCAR_MODEL_GATEWAY and BOXCAR_MODEL_TOKEN. */
  env(gatewayUrl?: string): Record<string, string>;
  readonly usage: Usage;
  readonly calls: number;
  /** Ends the pass: its token is refused from now on, and calls still under way are cut off. */
  close(): void;
}

const DEFAULT_MAX_REQUEST_BYTES = 32 * 1024 * 1024;
/** Request headers not passed on: the hop's own, the caller's credential, and compression (the gateway reads answers). */
const DROPPED_REQUEST_HEADERS = new Set([
  "host",
  "connection",
  "keep-alive",
  "content-length",
  "transfer-encoding",
  "authorization",
  "x-api-key",
  "accept-encoding",
  "proxy-authorization",
]);
const DROPPED_RESPONSE_HEADERS = new Set(["connection", "keep-alive", "transfer-encoding"]);

interface Pass extends AttemptAccess {
  token: string;
  usage: Usage;
  calls: number;
  /** Calls begun, in order: a call's place in the sequence. */
  begun: number;
  inFlight: Set<AbortController>;
}

export class ModelGateway {
  private readonly passes = new Map<string, Pass>();
  /** Unix sockets it listens on too, for sandboxes with no network. */
  private readonly extra = new Set<Server>();
  private readonly httpAgent = new HttpAgent({ keepAlive: true });
  private readonly httpsAgent = new HttpsAgent({ keepAlive: true });

  private constructor(
    private readonly server: Server,
    private readonly options: GatewayOptions,
    private readonly log: Logger,
  ) {}

  static async start(options: GatewayOptions, log: Logger): Promise<ModelGateway> {
    const server = createServer();
    const gateway = new ModelGateway(server, options, log);
    gateway.serve(server);
    await new Promise<void>((ready, fail) => {
      server.once("error", fail);
      server.listen(options.port ?? 0, options.host ?? "127.0.0.1", () => ready());
    });
    return gateway;
  }

  /**
   * Listens on a Unix socket as well, until the returned function is called: a sandbox with no
   * network reaches the gateway through it (a socket in its bind-mounted workspace). Anyone who
   * can reach the file may connect (mode 0666); the token is what lets a call through.
   */
  async listenUnix(path: string): Promise<() => Promise<void>> {
    const server = createServer();
    this.serve(server);
    await rm(path, { force: true });
    await new Promise<void>((ready, fail) => {
      server.once("error", fail);
      server.listen(path, () => ready());
    });
    await chmod(path, 0o666);
    this.extra.add(server);
    return async () => {
      this.extra.delete(server);
      await new Promise<void>((done) => server.close(() => done()));
      server.closeAllConnections();
      await rm(path, { force: true });
    };
  }

  private serve(server: Server): void {
    server.on("request", (req, res) => {
      this.handle(req, res).catch((err: unknown) => {
        this.log.error({ err }, "model gateway: a request failed");
        if (!res.headersSent) res.writeHead(500).end();
        else res.destroy();
      });
    });
  }

  /** Its address, as host agents reach it. */
  get url(): string {
    const { address, port } = this.server.address() as AddressInfo;
    return `http://${address.includes(":") ? `[${address}]` : address}:${port}`;
  }

  /** Where sandboxes off this machine reach it (`publicUrl`, without a trailing slash); undefined when nowhere. */
  get publicUrl(): string | undefined {
    return this.options.publicUrl?.replace(/\/+$/, "");
  }

  /** The providers it holds a key for. */
  get providers(): ModelProvider[] {
    return Object.keys(this.options.providers) as ModelProvider[];
  }

  /** What it offers, as the worker's presence says: the providers it holds a key for, and whether it has a public address. */
  reach(): GatewayReach {
    return { providers: this.providers, public: this.publicUrl !== undefined };
  }

  /** Opens a pass for one attempt: a new token, valid until `close`. */
  open(access: AttemptAccess): GatewayPass {
    const token = `bxm_${randomBytes(24).toString("base64url")}`;
    const pass: Pass = { ...access, token, usage: NO_USAGE, calls: 0, begun: 0, inFlight: new Set() };
    this.passes.set(token, pass);
    return {
      env: (gatewayUrl = this.url) => ({
        ...Object.assign({}, ...access.providers.map((p) => PROVIDER_WIRES[p].env(`${gatewayUrl}${PROVIDER_WIRES[p].basePath}`, token))),
        BOXCAR_MODEL_GATEWAY: gatewayUrl,
        BOXCAR_MODEL_TOKEN: token,
      }),
      get usage() {
        return pass.usage;
      },
      get calls() {
        return pass.calls;
      },
      close: () => {
        this.passes.delete(token);
        for (const call of pass.inFlight) call.abort();
      },
    };
  }

  async close(): Promise<void> {
    for (const pass of this.passes.values()) for (const call of pass.inFlight) call.abort();
    this.passes.clear();
    for (const server of this.extra) {
      server.close();
      server.closeAllConnections();
    }
    await new Promise<void>((done) => this.server.close(() => done()));
    this.server.closeAllConnections();
    this.httpAgent.destroy();
    this.httpsAgent.destroy();
  }

  private async handle(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const started = performance.now();
    const url = new URL(req.url ?? "/", "http://gateway");
    const route = routeOf(url.pathname);
    if (!route) {
      res.writeHead(404, { "content-type": "application/json" });
      res.end(JSON.stringify({ error: { message: `no provider at ${url.pathname}: use /anthropic or /openai/v1`, type: "not_found" } }));
      return;
    }
    const { wire, rest } = route;
    const refuse = (status: number, message: string) => {
      req.resume();
      res.writeHead(status, { "content-type": "application/json" });
      res.end(wire.errorBody(status, message));
    };
    const token = wire.tokenOf(req.headers);
    const pass = token === undefined ? undefined : this.passes.get(token);
    if (!pass) return refuse(401, "Boxcar's model gateway: no such token, or its attempt has ended");
    if (!pass.providers.includes(wire.name)) {
      return refuse(403, `Boxcar's model gateway: this agent may not call ${wire.name} (its definition's models.providers)`);
    }
    const access = this.options.providers[wire.name];
    if (!access) return refuse(503, `Boxcar's model gateway: this worker holds no ${wire.name} key`);
    const body = await readBody(req, this.options.maxRequestBytes ?? DEFAULT_MAX_REQUEST_BYTES);
    if (body === undefined) return refuse(413, "Boxcar's model gateway: the request body is too large");
    const asked = parseRequest(wire, rest, body);
    const position = ++pass.begun;
    const hash = pass.recorder ? requestHash(wire.name, rest, asked.body) : "";

    const upstream = new URL(`${(access.baseUrl ?? wire.defaultUpstream).replace(/\/+$/, "")}${rest}${url.search}`);
    const headers: Record<string, string | string[]> = {};
    for (const [name, value] of Object.entries(req.headers)) {
      if (value !== undefined && !DROPPED_REQUEST_HEADERS.has(name)) headers[name] = value;
    }
    Object.assign(headers, wire.authHeaders(access.key), { "accept-encoding": "identity" });
    if (asked.body.length > 0) headers["content-length"] = String(asked.body.length);

    const abort = new AbortController();
    pass.inFlight.add(abort);
    const { span } = startSpan(`model.call ${wire.name}`, pass.traceparent, {
      kind: SpanKind.CLIENT,
      attributes: {
        "gen_ai.system": wire.name,
        "gen_ai.operation.name": rest.includes("messages") ? "chat" : rest.replace(/^\//, ""),
        ...(asked.model ? { "gen_ai.request.model": asked.model } : {}),
        "boxcar.job.id": pass.jobId,
        "boxcar.attempt": pass.attempt,
      },
    });
    req.on("close", () => {
      if (!res.writableEnded) abort.abort();
    });
    let reported = false;
    let replayed = false;
    /** The limits' windows the call was let through in: its tokens are added there once it ended. */
    let ticket: string[] = [];
    /** Reports the call once, however it ended (an answer's end, or its connection breaking). */
    const report = (status: number, metered: Metered, firstByteMs?: number, refused?: ModelCall["refused"]) => {
      if (reported) return;
      reported = true;
      pass.inFlight.delete(abort);
      const call: ModelCall = {
        provider: wire.name,
        endpoint: rest.slice(0, 256),
        status,
        stream: asked.stream,
        latencyMs: Math.round(performance.now() - started),
        tokensIn: metered.tokensIn,
        tokensOut: metered.tokensOut,
        ...(firstByteMs !== undefined ? { firstByteMs: Math.round(firstByteMs) } : {}),
        ...((metered.model ?? asked.model) ? { model: metered.model ?? asked.model } : {}),
        ...(metered.cacheReadTokens ? { cacheReadTokens: metered.cacheReadTokens } : {}),
        ...(metered.cacheWriteTokens ? { cacheWriteTokens: metered.cacheWriteTokens } : {}),
        ...(replayed ? { replayed: true } : {}),
        ...(refused ? { refused } : {}),
      };
      span.setAttributes({
        "http.response.status_code": status,
        "gen_ai.usage.input_tokens": call.tokensIn,
        "gen_ai.usage.output_tokens": call.tokensOut,
        ...(call.model ? { "gen_ai.response.model": call.model } : {}),
      });
      if (status >= 400 || status === 0) failSpan(span, { message: `${wire.name} answered ${status}` });
      span.end();
      pass.calls += 1;
      if (ticket.length > 0) {
        pass.limiter?.spend(ticket, call.tokensIn + call.tokensOut).catch((err: unknown) => {
          this.log.warn({ err, jobId: pass.jobId }, "model gateway: could not count a call's tokens against the model limits");
        });
      }
      const cost = replayed ? 0 : (pass.price?.(call) ?? 0);
      if (cost > 0) call.cost = cost;
      // A replayed call used nothing of the provider's this time: it counts as a call, not its
      // tokens; one the gateway refused counts for nothing.
      if (!refused) {
        const used = { calls: 1, tokensIn: replayed ? 0 : call.tokensIn, tokensOut: replayed ? 0 : call.tokensOut, cost };
        pass.usage = addUsage(pass.usage, call.model ? { ...used, models: { [call.model]: used } } : used);
      }
      pass.onCall(call);
    };

    // A recorded answer to the same request at the same place: given again, the provider not called.
    const recorded = await pass.recorder?.replay(position, hash).catch((err: unknown) => {
      this.log.warn({ err, jobId: pass.jobId }, "model gateway: could not read a recorded call; calling the provider");
      return undefined;
    });
    if (recorded) {
      const streamedAnswer = String(recorded.headers["content-type"] ?? "").includes("text/event-stream");
      res.writeHead(recorded.status, recorded.headers);
      // Recorded as the provider sent it: the usage chunk asked for on the agent's behalf is left out again.
      const filter = streamedAnswer && asked.usageAsked ? new UsageChunkFilter() : undefined;
      res.end(filter ? Buffer.concat([filter.push(recorded.body), filter.end()]) : recorded.body);
      const meter = streamedAnswer ? new SseMeter(wire.name) : undefined;
      meter?.push(recorded.body);
      replayed = true;
      report(recorded.status, meter ? meter.end() : meterJson(wire.name, recorded.body.toString("utf8")), 0);
      return;
    }

    // A budget that stops, once spent, stops every call after: refused as a provider refuses a
    // key with no quota left, which the SDKs do not try again (`x-should-retry: false`).
    const spentBudget = await pass.spentBudget?.().catch((err: unknown) => {
      this.log.warn({ err, jobId: pass.jobId }, "model gateway: could not read the budgets' spending; letting the call through");
      return undefined;
    });
    if (spentBudget) {
      res.writeHead(429, { "content-type": "application/json", "x-should-retry": "false" });
      res.end(wire.errorBody(429, `Boxcar's model gateway: ${spentBudget}`, "insufficient_quota"));
      report(429, { tokensIn: 0, tokensOut: 0 }, undefined, "budget");
      return;
    }

    // The fleet's limits: the call waits for room (up to the limit's wait), else is refused as the
    // provider refuses one over its own rate limit. Limits that cannot be read let it through.
    if (pass.limiter) {
      const admitted = await pass.limiter.admit(wire.name, asked.model, abort.signal).catch((err: unknown) => {
        if (abort.signal.aborted) return { retryAfterS: 0 };
        this.log.warn({ err, jobId: pass.jobId }, "model gateway: could not count a call against the model limits; letting it through");
        return { ticket: [] };
      });
      if ("retryAfterS" in admitted) {
        if (abort.signal.aborted) return report(499, { tokensIn: 0, tokensOut: 0 });
        res.writeHead(429, { "content-type": "application/json", "retry-after": String(admitted.retryAfterS) });
        res.end(
          wire.errorBody(
            429,
            `Boxcar's model gateway: the fleet's limit on ${wire.name}${asked.model ? ` ${asked.model}` : ""} calls is reached (the system policy's modelLimits); retry after ${admitted.retryAfterS} s`,
          ),
        );
        report(429, { tokensIn: 0, tokensOut: 0 }, undefined, "limit");
        return;
      }
      ticket = admitted.ticket;
    }

    const send = upstream.protocol === "https:" ? httpsRequest : httpRequest;
    const forward = send(upstream, {
      method: req.method ?? "POST",
      headers,
      agent: upstream.protocol === "https:" ? this.httpsAgent : this.httpAgent,
      signal: abort.signal,
    });
    forward.on("error", (err) => {
      if (res.headersSent) {
        res.destroy();
        report(res.statusCode, { tokensIn: 0, tokensOut: 0 });
        return;
      }
      const cut = abort.signal.aborted;
      this.log.warn({ err, provider: wire.name, jobId: pass.jobId }, "model gateway: the provider could not be reached");
      res.writeHead(502, { "content-type": "application/json" });
      res.end(
        wire.errorBody(
          502,
          cut
            ? "Boxcar's model gateway: the call was cut off"
            : `Boxcar's model gateway: ${wire.name} could not be reached (${(err as Error).message})`,
        ),
      );
      report(502, { tokensIn: 0, tokensOut: 0 });
    });
    forward.on("response", (answer) => {
      const firstByteMs = performance.now() - started;
      const out: Record<string, string | string[]> = {};
      for (const [name, value] of Object.entries(answer.headers)) {
        if (value !== undefined && !DROPPED_RESPONSE_HEADERS.has(name)) out[name] = value;
      }
      res.writeHead(answer.statusCode ?? 502, out);
      const streamed = String(answer.headers["content-type"] ?? "").includes("text/event-stream");
      const sse = streamed ? new SseMeter(wire.name) : undefined;
      // The usage chunk the gateway asked for on the agent's behalf is read, not passed on: code
      // written for a stream without it need not expect a chunk with no choices.
      const unasked = streamed && asked.usageAsked ? new UsageChunkFilter() : undefined;
      const whole: Buffer[] = [];
      let wholeBytes = 0;
      // The answer as the provider sent it, kept to be recorded (up to MAX_RECORDED_BODY; a longer one is not).
      const sent: Buffer[] = [];
      let sentBytes = 0;
      answer.on("data", (chunk: Buffer) => {
        const passed = unasked ? unasked.push(chunk) : chunk;
        if (passed.length > 0) res.write(passed);
        if (pass.recorder && sentBytes <= MAX_RECORDED_BODY) {
          sent.push(chunk);
          sentBytes += chunk.length;
        }
        if (sse) sse.push(chunk);
        else if (wholeBytes < MAX_METERED_BODY) {
          whole.push(chunk);
          wholeBytes += chunk.length;
        }
      });
      answer.on("end", () => {
        const rest = unasked?.end();
        res.end(rest);
        const status = answer.statusCode ?? 0;
        if (pass.recorder && status >= 200 && status < 300 && sentBytes <= MAX_RECORDED_BODY) {
          const kept: Record<string, string> = {};
          for (const [name, value] of Object.entries(out)) if (typeof value === "string" && name !== "content-length") kept[name] = value;
          pass.recorder.record(position, hash, { status, headers: kept, body: Buffer.concat(sent) }).catch((err: unknown) => {
            this.log.warn({ err, jobId: pass.jobId }, "model gateway: could not record a call");
          });
        }
        report(status, sse ? sse.end() : meterJson(wire.name, Buffer.concat(whole).toString("utf8")), firstByteMs);
      });
      answer.on("error", () => {
        res.destroy();
        report(answer.statusCode ?? 0, sse ? sse.end() : { tokensIn: 0, tokensOut: 0 }, firstByteMs);
      });
    });
    forward.end(asked.body);
  }
}
