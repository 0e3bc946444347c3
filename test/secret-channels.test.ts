/**
 * Attack (issue 35): an agent given a secret tries every channel it has to the outside, each
 * field of every file it may write, its output, its progress lines, its artifacts' names and
 * contents, a handoff, its usage file, a result file that does not parse, and finds the secret,
 * or any 8-character piece of it, nowhere: not in any message of any stream (records, events,
 * logs, artifacts, usage, dead letters), not in the API's answers, not in the roles' log lines.
 * Against a secured nats-server, a dispatcher and a host worker.
 */

import { randomBytes } from "node:crypto";
import { readdir, readFile } from "node:fs/promises";
import { join } from "node:path";
import type { JobRecord } from "@boxcar/protocol";
import { scratch } from "@boxcar/testing";
import { REDACTED } from "@boxcar/worker";
import { jetstreamManager } from "@nats-io/jetstream";
import { expect, test } from "vitest";
import { securedSystem } from "./helpers/secured.js";

const secret = `sk-${randomBytes(16).toString("hex")}`;
const host = { trusted: true, runtime: { sandbox: "host" as const }, secrets: ["VICTIM_TOKEN"] };

/** Agents, one channel (or several that one job can carry at once) each. */
const leaks: Record<string, string> = {
  // Output, progress, a result with the secret in every field (keys too), a handoff carrying it,
  // usage lines naming it as a model (and a bad line quoting it), artifacts named after it and holding it.
  everything: [
    'echo "out $VICTIM_TOKEN"; echo "err $VICTIM_TOKEN" >&2; echo "::progress working with $VICTIM_TOKEN"',
    'mkdir -p out; echo "$VICTIM_TOKEN" > "out/$VICTIM_TOKEN.txt"; echo "key: $VICTIM_TOKEN" > out/plain.txt',
    `printf '{"model":"m-%s","tokensIn":1}\\n{"model":"%s","tokensIn":2}\\n{"model":"ok","tokensIn":"%s"}\\n' "$VICTIM_TOKEN" "$VICTIM_TOKEN" "$VICTIM_TOKEN" >> "$BOXCAR_USAGE_FILE"`,
    `printf '{"output":{"%s":"%s","list":["%s"]},"summary":"done %s","handoff":{"to":"relay","input":{"token":"%s"}}}' "$VICTIM_TOKEN" "$VICTIM_TOKEN" "$VICTIM_TOKEN" "$VICTIM_TOKEN" "$VICTIM_TOKEN" > "$BOXCAR_RESULT_FILE"`,
  ].join("\n"),
  // A result file that is no JSON, whose parser's message would quote its start.
  "bad-json": `printf '{"output": %s' "$VICTIM_TOKEN" > "$BOXCAR_RESULT_FILE"`,
  "bad-json-early": `printf '%s' "$VICTIM_TOKEN" > "$BOXCAR_RESULT_FILE"`,
  // A result whose fields are of the wrong kind, or name an agent that cannot be.
  "bad-fields": `printf '{"summary":{"%s":1},"retry":"%s","handoff":{"to":"%s"}}' "$VICTIM_TOKEN" "$VICTIM_TOKEN" "$VICTIM_TOKEN" > "$BOXCAR_RESULT_FILE"`,
  // Its own error, and a failing exit (retried once, then dead: the dead-letter stream has it too).
  "own-error": `printf '{"error":"failed on %s","retry":true}' "$VICTIM_TOKEN" > "$BOXCAR_RESULT_FILE"; echo "$VICTIM_TOKEN" >&2; exit 3`,
  // The secret encoded as people and tools print it: base64 (after other text too), hex, URL-encoded.
  encoded: [
    'printf %s "$VICTIM_TOKEN" | base64; printf "x%s" "$VICTIM_TOKEN" | base64 >&2',
    'printf %s "$VICTIM_TOKEN" | od -An -tx1 | tr -d " \\n"; echo',
    `printf '{"summary":"%s"}' "$(printf %s "$VICTIM_TOKEN" | base64)" > "$BOXCAR_RESULT_FILE"`,
  ].join("\n"),
  // Half the secret (a cut a field's limit could make), then the rest: pieces of 8 and more are kept out.
  pieces: `printf '{"summary":"%s","output":"%s"}' "$(printf %s "$VICTIM_TOKEN" | cut -c1-12)" "$(printf %s "$VICTIM_TOKEN" | cut -c13-)" > "$BOXCAR_RESULT_FILE"`,
};

test("an agent given a secret finds no channel that carries it, or any 8-character piece of it, out", async () => {
  await using system = await securedSystem({ secretsEnv: { VICTIM_TOKEN: secret } });
  const admin = await system.as("boss", "admin");
  const alice = await system.as("alice");
  await admin.client.applyAgent({ name: "relay", trusted: true, runtime: { sandbox: "host" }, command: 'cat "$BOXCAR_INPUT_FILE"' });
  for (const [name, command] of Object.entries(leaks)) {
    await admin.client.applyAgent({
      name,
      ...host,
      command,
      handoffs: ["relay"],
      ...(name === "own-error" ? { retry: { maxAttempts: 2, delay: "10ms" } } : {}),
    });
  }

  const ended: JobRecord[] = [];
  for (const name of Object.keys(leaks)) {
    const { job } = await alice.client.submit({ agent: name });
    ended.push(await alice.client.waitForChain(job.id));
  }
  const byAgent = Object.fromEntries(
    await Promise.all(Object.keys(leaks).map(async (name) => [name, (await alice.client.listJobs({ agent: name })).jobs[0]] as const)),
  );

  // Each channel was tried, and carried the marker where the secret was.
  expect(byAgent.everything).toMatchObject({ state: "succeeded", result: { summary: `done ${REDACTED}` } });
  expect(byAgent.everything?.result?.output).toEqual({ [REDACTED]: REDACTED, list: [REDACTED] });
  expect(byAgent.everything?.artifacts.map((a) => a.path).sort()).toEqual([`out/${REDACTED}.txt`, "out/plain.txt"]);
  expect(byAgent.everything?.usage).toMatchObject({ calls: 2, models: { [`m-${REDACTED}`]: { calls: 1 } } });
  const relayed = ended.find((j) => j.agent === "relay");
  expect(relayed?.spec?.input).toEqual({ token: REDACTED });
  expect(byAgent["bad-json"]).toMatchObject({ state: "failed", error: { code: "bad_result" } });
  expect(byAgent["bad-json-early"]).toMatchObject({ state: "failed", error: { code: "bad_result" } });
  expect(byAgent["bad-fields"]).toMatchObject({ state: "failed", error: { code: "bad_result" } });
  expect(byAgent["own-error"]).toMatchObject({ state: "dead", error: { message: `failed on ${REDACTED}` } });
  expect(byAgent.pieces?.result).toMatchObject({ summary: REDACTED, output: REDACTED });
  expect(byAgent.encoded).toMatchObject({ state: "succeeded", result: { summary: expect.stringContaining(REDACTED) } });

  // What the API answers: records, events, logs, usage, artifacts downloaded.
  const answers: unknown[] = [await admin.client.listJobs({ limit: 1000 }), await admin.client.getUsage()];
  for (const job of (await admin.client.listJobs({ limit: 1000 })).jobs) {
    for await (const event of admin.client.events(job.id)) answers.push(event);
    for await (const chunk of admin.client.logs(job.id)) answers.push(Buffer.from(chunk.data).toString());
  }
  await using dir = await scratch("boxcar-leak-artifacts-");
  await admin.client.downloadArtifacts(byAgent.everything?.id as string, dir.path);
  const files = await readdir(dir.path, { recursive: true });
  const downloaded = await Promise.all(files.map(async (f) => `${f}\n${await readFile(join(dir.path, f)).catch(() => "")}`));

  // Every message of every stream: job records, events, logs, artifacts, usage sums, dead letters.
  const stored: string[] = [];
  const jsm = await jetstreamManager(admin.nc);
  for await (const stream of jsm.streams.list()) {
    const { first_seq, last_seq } = stream.state;
    for (let seq = first_seq; seq <= last_seq && last_seq > 0; seq++) {
      const msg = await jsm.streams.getMessage(stream.config.name, { seq }).catch(() => null);
      if (msg) stored.push(msg.subject, Buffer.from(msg.data).toString("latin1"));
    }
  }
  expect(stored.join("\n")).toContain(REDACTED); // the scan reads what the jobs wrote

  const everything = [JSON.stringify(answers), downloaded.join("\n"), stored.join("\n"), system.logLines.join("\n")].join("\n");
  expect(everything.includes(secret), "the whole secret").toBe(false);
  const pieces = Array.from({ length: secret.length - 7 }, (_, i) => secret.slice(i, i + 8));
  expect(pieces.filter((piece) => everything.includes(piece))).toEqual([]);
  // Nor encoded: its hex, and its base64 at each alignment (what 8 bytes of it make, 12 characters).
  const bytes = Buffer.from(secret);
  const encoded = [bytes.toString("hex")];
  for (const before of ["", "x", "xy"])
    encoded.push(
      Buffer.from(before + secret)
        .toString("base64")
        .slice(before ? 4 : 0, before ? 16 : 12),
    );
  expect(encoded.filter((form) => everything.includes(form))).toEqual([]);
});
