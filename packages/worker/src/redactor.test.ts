import type { Logger } from "@boxcar/client";
import { expect, test } from "vitest";
import { REDACTED, Redactor } from "./redactor.js";

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
