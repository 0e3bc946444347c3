/**
 * Workflow templates: `{{ expression }}` inside any string of a step's `input`, and its `if`
 * and `forEach`. An expression is a reference (`input.topic`, `steps.plan.output.files[0]`,
 * `item`, `index`), optionally negated (`!ref`) or compared with a JSON literal
 * (`ref == "approve"`, `ref != 3`). A string that is exactly one `{{ … }}` becomes the value
 * itself (an object stays an object); otherwise each expression is written into the string.
 */

const SEGMENT = "[A-Za-z_][A-Za-z0-9_-]*";
const REFERENCE = new RegExp(String.raw`^(${SEGMENT})((?:\.${SEGMENT}|\[\d+\])*)$`);
const COMPARISON = /^(.*?)\s*(==|!=)\s*(.+)$/;
const PLACEHOLDER = /\{\{(.*?)\}\}/g;
const WHOLE = /^\{\{(.*?)\}\}$/;

/** A reference: its path, e.g. `["steps", "plan", "output", 0]`. */
export type Reference = readonly (string | number)[];

export type Expression =
  | { kind: "ref"; ref: Reference; negate: boolean }
  | { kind: "compare"; ref: Reference; op: "==" | "!="; literal: unknown };

export class TemplateError extends Error {
  override readonly name = "TemplateError";
}

export function parseReference(text: string): Reference {
  const m = REFERENCE.exec(text.trim());
  if (!m) throw new TemplateError(`${JSON.stringify(text.trim())} is not a reference such as input.topic or steps.plan.output`);
  const path: (string | number)[] = [m[1] as string];
  for (const part of (m[2] ?? "").matchAll(/\.([^.[]+)|\[(\d+)\]/g)) path.push(part[1] ?? Number(part[2]));
  return path;
}

export function parseExpression(text: string): Expression {
  const trimmed = text.trim();
  const compare = COMPARISON.exec(trimmed);
  if (compare) {
    let literal: unknown;
    try {
      literal = JSON.parse(compare[3] as string);
    } catch {
      throw new TemplateError(`${compare[3]} is not a JSON literal (quote strings: "approve")`);
    }
    return { kind: "compare", ref: parseReference(compare[1] as string), op: compare[2] as "==" | "!=", literal };
  }
  const negate = trimmed.startsWith("!");
  return { kind: "ref", ref: parseReference(negate ? trimmed.slice(1) : trimmed), negate };
}

/** The expressions in a string, in order. */
export function expressionsIn(text: string): Expression[] {
  return [...text.matchAll(PLACEHOLDER)].map((m) => parseExpression(m[1] as string));
}

/** Every string in a JSON value, with its path inside the value. */
export function* stringsIn(value: unknown, path: (string | number)[] = []): Generator<[string, (string | number)[]]> {
  if (typeof value === "string") yield [value, path];
  else if (Array.isArray(value)) for (const [i, v] of value.entries()) yield* stringsIn(v, [...path, i]);
  else if (value !== null && typeof value === "object") for (const [k, v] of Object.entries(value)) yield* stringsIn(v, [...path, k]);
}

/** Looks a reference up in `scope`; a missing value is an error naming the reference. */
export function resolve(ref: Reference, scope: unknown): unknown {
  let value: unknown = scope;
  for (const seg of ref) {
    if (value === null || typeof value !== "object" || !Object.hasOwn(value, seg)) {
      throw new TemplateError(`${formatReference(ref)} is not there (no ${JSON.stringify(seg)})`);
    }
    value = (value as Record<string | number, unknown>)[seg];
  }
  return value;
}

export function formatReference(ref: Reference): string {
  return ref.map((s, i) => (typeof s === "number" ? `[${s}]` : i === 0 ? s : `.${s}`)).join("");
}

export function evaluate(expr: Expression, scope: unknown): unknown {
  const value = resolve(expr.ref, scope);
  if (expr.kind === "compare") {
    const equal = JSON.stringify(value) === JSON.stringify(expr.literal);
    return expr.op === "==" ? equal : !equal;
  }
  return expr.negate ? !truthy(value) : value;
}

/** Falsy: false, null, 0, "", an empty list or object. */
export function truthy(value: unknown): boolean {
  if (Array.isArray(value)) return value.length > 0;
  if (value !== null && typeof value === "object") return Object.keys(value).length > 0;
  return Boolean(value);
}

/** Renders every template in a JSON value against `scope`. */
export function render(value: unknown, scope: unknown): unknown {
  if (typeof value === "string") {
    const whole = WHOLE.exec(value);
    if (whole && !(whole[1] as string).includes("{{")) return evaluate(parseExpression(whole[1] as string), scope);
    return value.replace(PLACEHOLDER, (_, text: string) => {
      const v = evaluate(parseExpression(text), scope);
      return typeof v === "string" ? v : JSON.stringify(v);
    });
  }
  if (Array.isArray(value)) return value.map((v) => render(v, scope));
  if (value !== null && typeof value === "object") {
    return Object.fromEntries(Object.entries(value).map(([k, v]) => [k, render(v, scope)]));
  }
  return value;
}
