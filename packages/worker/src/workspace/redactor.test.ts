import type { Logger } from "@boxcar/common";
import { expect, test } from "vitest";
import { encodingsOf, REDACTED, Redactor } from "./redactor.js";

const secret = "sk-0123456789abcdefXYZ";

test("a string loses every secret and every piece of one of 8 characters or more; shorter pieces and other text stay", () => {
  const r = new Redactor([secret]);
  expect(r.text(`key ${secret}, again ${secret}`)).toBe(`key ${REDACTED}, again ${REDACTED}`);
  // A parser's message quoting the start of a file, a field cut at its limit, the end alone.
  expect(r.text('Unexpected token, "{"output": sk-0123456"... is not valid JSON')).toBe(
    `Unexpected token, "{"output": ${REDACTED}"... is not valid JSON`,
  );
  expect(r.text("tail 89abcdefXYZ.")).toBe(`tail ${REDACTED}.`);
  expect(r.text("sk-0123 is seven")).toBe("sk-0123 is seven");
  expect(r.text("nothing here")).toBe("nothing here");
});

test("a JSON value is redacted whole, keys and errors included; with no secrets it is the value itself", () => {
  const r = new Redactor([secret]);
  expect(r.json({ [secret]: [secret, 1, null, { deep: `x${secret}` }] })).toEqual({
    [REDACTED]: [REDACTED, 1, null, { deep: `x${REDACTED}` }],
  });
  expect(JSON.stringify(r.json({ err: new Error(`failed with ${secret}`) }))).not.toContain("0123456789");
  const value = { a: secret };
  expect(new Redactor().json(value)).toBe(value);
});

test("secrets added later are redacted from then on, by the logger made before too", () => {
  const lines: string[] = [];
  const write = (obj: object, msg?: string) => lines.push(JSON.stringify({ ...obj, msg }));
  const r = new Redactor();
  const base: Logger = { debug: write, info: write, warn: write, error: write, child: () => base };
  const log = r.logger(base).child({ jobId: "j" });
  r.add([secret]);
  log.error({ err: new Error(secret), detail: { secret } }, `could not read ${secret.slice(0, 10)}`);
  expect(lines.join("\n")).not.toMatch(/0123456|abcdefXY/);
  expect(lines.join("\n")).toContain(REDACTED);
});

test("a byte stream loses whole secrets however it is cut", () => {
  const stream = new Redactor([secret]).stream();
  const text = `a ${secret} b ${secret}`;
  let out = "";
  for (let i = 0; i < text.length; i += 5) out += Buffer.from(stream.push(Buffer.from(text.slice(i, i + 5)))).toString();
  out += Buffer.from(stream.end()).toString();
  expect(out).toBe(`a ${REDACTED} b ${REDACTED}`);
});

test("a secret printed encoded is redacted too: base64 and base64url at any alignment, hex in either case, URL-encoded", () => {
  const secret = "sk-live+key/with=odd chars&more";
  const r = new Redactor([secret]);
  const leaks = [
    ...["", "a", "ab"].map((before) => Buffer.from(`${before}${secret}\n`).toString("base64")),
    Buffer.from(`x${secret}`).toString("base64url"),
    Buffer.from(secret).toString("hex"),
    Buffer.from(secret).toString("hex").toUpperCase(),
    encodeURIComponent(secret),
  ];
  for (const leak of leaks) {
    const out = r.text(`said: ${leak}`);
    expect(out, leak).toContain(REDACTED);
    // What is left of the encoded form carries at most a few of the secret's bytes at its edges.
    expect(out.length, leak).toBeLessThan(`said: ${leak}`.length - 8);
  }
  // And in a byte stream, however it is cut.
  const stream = r.stream();
  const b64 = Buffer.from(secret).toString("base64");
  let out = "";
  for (let i = 0; i < b64.length; i += 7) out += Buffer.from(stream.push(Buffer.from(b64.slice(i, i + 7)))).toString();
  out += Buffer.from(stream.end()).toString();
  expect(out).toContain(REDACTED);
  expect(encodingsOf("abc")).toEqual([]); // too short to tell apart from anything else
});
