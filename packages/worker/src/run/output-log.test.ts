import type { LogStream } from "@boxcar/protocol";
import { describe, expect, test } from "vitest";
import { REDACTED, Redactor } from "../workspace/redactor.js";
import { MAX_LOG_CHUNK, OutputLog } from "./output-log.js";

const bytes = (s: string) => new TextEncoder().encode(s);

function collect(opts: { maxBytes?: number; secrets?: string[] } = {}) {
  const published: { stream: LogStream; data: Uint8Array }[] = [];
  const progress: string[] = [];
  const log = new OutputLog({
    publish: async (stream, data) => {
      await new Promise((r) => setTimeout(r, 1));
      published.push({ stream, data: data.slice() });
    },
    maxBytes: opts.maxBytes ?? 1024 * 1024,
    redactor: new Redactor(opts.secrets),
    onProgress: (m) => progress.push(m),
    onPublishError: (err) => {
      throw err;
    },
  });
  const text = (stream?: LogStream) =>
    published
      .filter((p) => stream === undefined || p.stream === stream)
      .map((p) => Buffer.from(p.data).toString())
      .join("");
  return { log, published, progress, text };
}

describe("OutputLog", () => {
  test("publishes every byte in order, in chunks of at most 32 KiB", async () => {
    const { log, published, text } = collect();
    const big = "x".repeat(MAX_LOG_CHUNK * 2 + 10);
    log.write("stdout", bytes("one "));
    log.write("stderr", bytes("two "));
    log.write("stdout", bytes(big));
    log.write("stdout", bytes(" three"));
    await log.close();
    expect(text()).toBe(`one two ${big} three`);
    expect(text("stderr")).toBe("two ");
    expect(Math.max(...published.map((p) => p.data.length))).toBeLessThanOrEqual(MAX_LOG_CHUNK);
  });

  test("caps the output, then adds one marker on stderr and drops the rest", async () => {
    const { log, text } = collect({ maxBytes: 10 });
    log.write("stdout", bytes("12345678"));
    log.write("stdout", bytes("90abc"));
    log.write("stderr", bytes("more"));
    log.write("stdout", bytes("and more"));
    await log.close();
    expect(text("stdout")).toBe("1234567890");
    expect(text("stderr")).toBe("\n[boxcar: output truncated after 10 bytes]\n");
  });

  test("progress lines become messages, also when split across chunks", async () => {
    const { log, progress, text } = collect();
    log.write("stdout", bytes("hello\n::prog"));
    log.write("stdout", bytes("ress step 1\r\n::progress "));
    log.write("stdout", bytes("step 2\nnot ::progress x\n"));
    log.write("stderr", bytes("::progress on stderr\n"));
    log.write("stdout", bytes(`::progress ${"é".repeat(2000)}\n::progress last`));
    await log.close();
    expect(progress).toEqual(["step 1", "step 2", "é".repeat(1024), "last"]);
    expect(text("stdout")).toContain("::progress step 1");
  });

  test("secret values are redacted, even when split across chunks", async () => {
    const { log, progress, text } = collect({ secrets: ["hunter2-secret"] });
    log.write("stdout", bytes("pw=hunter2-"));
    log.write("stdout", bytes("secret; hunt"));
    log.write("stdout", bytes("er and hunter2-secrethunter2-secret\n::progress using hunter2-secret\nend hunter2"));
    await log.close();
    expect(text()).not.toContain("hunter2-secret");
    expect(text()).toBe(`pw=${REDACTED}; hunter and ${REDACTED}${REDACTED}\n::progress using ${REDACTED}\nend hunter2`);
    expect(progress).toEqual([`using ${REDACTED}`]);
  });
});
