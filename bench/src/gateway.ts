/**
 * What the model gateway adds to a model call (docs/benchmarks.md#model-gateway): the same
 * requests sent straight to a stand-in provider and through the gateway in front of it,
 * interleaved one by one in one run, over one keep-alive connection each. Measured per call:
 * the whole call (a JSON answer) and the first byte of a streamed answer (server-sent events).
 *
 *   pnpm bench:gateway [calls]      # default 2000 of each kind
 */
import { Agent, createServer, request } from "node:http";
import type { AddressInfo } from "node:net";
import { silentLogger } from "@boxcar/common";
import { ModelGateway } from "@boxcar/worker";

const CALLS = Number(process.argv[2] ?? 2000);
const USAGE = { prompt_tokens: 11, completion_tokens: 7, total_tokens: 18 };

/** A provider that answers at once: a Chat Completions JSON body, or a short stream. */
const provider = createServer((req, res) => {
  const chunks: Buffer[] = [];
  req.on("data", (c: Buffer) => chunks.push(c));
  req.on("end", () => {
    const body = JSON.parse(Buffer.concat(chunks).toString("utf8")) as { stream?: boolean };
    if (!body.stream) {
      res.writeHead(200, { "content-type": "application/json" });
      res.end(
        JSON.stringify({
          id: "c",
          object: "chat.completion",
          model: "m",
          choices: [{ index: 0, message: { role: "assistant", content: "ok" } }],
          usage: USAGE,
        }),
      );
      return;
    }
    res.writeHead(200, { "content-type": "text/event-stream" });
    res.write(`data: ${JSON.stringify({ id: "c", model: "m", choices: [{ index: 0, delta: { content: "ok" } }], usage: null })}\n\n`);
    setImmediate(() => {
      res.write(`data: ${JSON.stringify({ id: "c", model: "m", choices: [], usage: USAGE })}\n\n`);
      res.end("data: [DONE]\n\n");
    });
  });
});
await new Promise<void>((r) => provider.listen(0, "127.0.0.1", r));
const providerUrl = `http://127.0.0.1:${(provider.address() as AddressInfo).port}/v1`;

const gateway = await ModelGateway.start({ providers: { openai: { key: "sk-bench", baseUrl: providerUrl } } }, silentLogger);
const pass = gateway.open({ jobId: "bench", attempt: 1, providers: ["openai"], onCall: () => {} });
const env = pass.env();

interface Timing {
  totalMs: number;
  firstByteMs: number;
}

/** One call over `agent`'s connection: its whole time, and the time to its first byte. */
function call(base: string, token: string, agent: Agent, stream: boolean): Promise<Timing> {
  const body = JSON.stringify({ model: "m", messages: [{ role: "user", content: "hi" }], stream });
  const url = new URL(`${base}/chat/completions`);
  const started = performance.now();
  return new Promise((resolve, reject) => {
    const req = request(
      url,
      {
        method: "POST",
        agent,
        headers: { authorization: `Bearer ${token}`, "content-type": "application/json", "content-length": Buffer.byteLength(body) },
      },
      (res) => {
        let firstByteMs = -1;
        res.on("data", () => {
          if (firstByteMs < 0) firstByteMs = performance.now() - started;
        });
        res.on("end", () => resolve({ totalMs: performance.now() - started, firstByteMs }));
        res.on("error", reject);
      },
    );
    req.on("error", reject);
    req.end(body);
  });
}

const direct = new Agent({ keepAlive: true, maxSockets: 1 });
const through = new Agent({ keepAlive: true, maxSockets: 1 });
const kinds = { json: false, stream: true } as const;
const results: Record<string, { direct: number[]; gateway: number[]; added: number[] }> = {};
for (const [kind, stream] of Object.entries(kinds)) {
  const what = stream ? "firstByteMs" : "totalMs";
  const r = { direct: [] as number[], gateway: [] as number[], added: [] as number[] };
  // Warm both paths up (connections, JIT).
  for (let i = 0; i < 200; i++) {
    await call(providerUrl, "sk-bench", direct, stream);
    await call(env.OPENAI_BASE_URL as string, env.OPENAI_API_KEY as string, through, stream);
  }
  for (let i = 0; i < CALLS; i++) {
    // Interleaved, alternating which goes first, so drift on a shared machine hits both alike.
    const pair = i % 2 === 0 ? ["direct", "gateway"] : ["gateway", "direct"];
    const timing: Record<string, number> = {};
    for (const path of pair) {
      const t =
        path === "direct"
          ? await call(providerUrl, "sk-bench", direct, stream)
          : await call(env.OPENAI_BASE_URL as string, env.OPENAI_API_KEY as string, through, stream);
      timing[path] = t[what];
    }
    r.direct.push(timing.direct as number);
    r.gateway.push(timing.gateway as number);
    r.added.push((timing.gateway as number) - (timing.direct as number));
  }
  results[kind] = r;
}

const pct = (xs: number[], p: number) => {
  const sorted = [...xs].sort((a, b) => a - b);
  return sorted[Math.min(sorted.length - 1, Math.floor((p / 100) * sorted.length))] as number;
};
const ms = (x: number) => `${x.toFixed(3)} ms`;
console.log(`model gateway: ${CALLS} calls of each kind, interleaved, one keep-alive connection per path (node ${process.version})`);
for (const [kind, r] of Object.entries(results)) {
  const what = kind === "stream" ? "first byte of a streamed answer" : "whole call, JSON answer";
  console.log(`  ${what}:`);
  console.log(`    direct    p50 ${ms(pct(r.direct, 50))}  p99 ${ms(pct(r.direct, 99))}`);
  console.log(`    gateway   p50 ${ms(pct(r.gateway, 50))}  p99 ${ms(pct(r.gateway, 99))}`);
  console.log(`    added     p50 ${ms(pct(r.added, 50))}  p99 ${ms(pct(r.added, 99))}  (per pair)`);
}
pass.close();
direct.destroy();
through.destroy();
await gateway.close();
provider.close();
