/**
 * The tables of docs/agent-contract.md, docs/nats-api.md and docs/architecture.md that restate the
 * code: fields, job states, error codes and names. `pnpm docs:tables` writes each between its
 * markers, and a test fails when a committed doc differs, so the docs cannot drift from the code.
 *
 * A field's meaning is its zod `.describe()` text, which the published JSON Schemas carry too; its
 * type and default are read from the JSON Schema where it says them plainly (an enum, a length
 * limit, a default). What only a reader of the docs needs (a duration's bounds in words, a default
 * another field fills in, a link) is in the `FieldDoc`s here.
 */
import type { AgentDefinitionInput, ResourceLimits, RuntimeWishes } from "./agent.js";
import { ERROR_CODE_DOCS, ERROR_STATUS, type ErrorCode } from "./errors.js";
import { JOB_STATE_DOCS, type JobRecord, type JobSpecInput, type JobState, TERMINAL_STATES } from "./job.js";
import { jsonSchemas } from "./json-schemas.js";
import { ApiEndpoint, DEFAULT_PREFIX, LOCAL_OWNER, type Names, names } from "./names.js";
import { DURATION_UNIT_MS, SIZE_UNIT } from "./units.js";
import { DEFAULT_CHAIN_LIMITS } from "./workflow.js";

/** One generated table: where it goes, and its Markdown. */
export interface DocTable {
  /** The file under docs/. */
  readonly doc: string;
  /** Names its markers. */
  readonly id: string;
  readonly markdown: string;
}

/** The comments a table sits between in its doc. */
export function docTableMarkers(id: string): { begin: string; end: string } {
  return { begin: `<!-- docs:tables ${id} begin -->`, end: `<!-- docs:tables ${id} end -->` };
}

/** The text between the markers of `id` in `text`, or undefined when `text` has no such markers. */
export function docTableRegion(text: string, id: string): string | undefined {
  const { begin, end } = docTableMarkers(id);
  const from = text.indexOf(begin);
  const to = text.indexOf(end, from);
  return from < 0 || to < 0 ? undefined : text.slice(from + begin.length, to).trim();
}

/** `text` with `table` written between its markers; throws when it has none. */
export function writeDocTable(text: string, table: DocTable): string {
  const { begin, end } = docTableMarkers(table.id);
  if (docTableRegion(text, table.id) === undefined) throw new Error(`docs/${table.doc} has no ${begin} ... ${end} markers`);
  const from = text.indexOf(begin);
  const to = text.indexOf(end, from);
  return `${text.slice(0, from)}${begin}\n${table.markdown}\n${text.slice(to)}`;
}

/** Every generated table. */
export function docTables(): DocTable[] {
  const schemas = jsonSchemas() as Record<string, JsonSchema>;
  const agent = schemas["agent.schema.json"] as JsonSchema;
  const runtime = agent.properties?.runtime as JsonSchema;
  const header = ["field", "type", "default", "meaning"];
  return [
    { doc: "agent-contract.md", id: "agent-fields", markdown: markdownTable(header, writtenRows(agent, AGENT_DOCS)) },
    { doc: "agent-contract.md", id: "agent-runtime", markdown: markdownTable(header, writtenRows(runtime, RUNTIME_DOCS, ["limits"])) },
    {
      doc: "nats-api.md",
      id: "job-spec",
      markdown: markdownTable(header, writtenRows(schemas["job-spec.schema.json"] as JsonSchema, SPEC_DOCS)),
    },
    {
      doc: "nats-api.md",
      id: "job-record",
      markdown: markdownTable(["field", "type", "meaning"], storedRows(schemas["job-record.schema.json"] as JsonSchema, RECORD_DOCS)),
    },
    { doc: "nats-api.md", id: "job-states", markdown: jobStatesTable() },
    { doc: "nats-api.md", id: "units", markdown: unitsTable() },
    { doc: "agent-contract.md", id: "units", markdown: unitsTable() },
    { doc: "nats-api.md", id: "error-codes", markdown: errorCodesTable() },
    { doc: "nats-api.md", id: "names", markdown: namesTable() },
    { doc: "architecture.md", id: "names", markdown: namesKindTable() },
  ];
}

/** What the docs say of a field beyond its schema. */
interface FieldDoc {
  /** The type in words, where the JSON Schema does not say it plainly (a duration, a token, a union). */
  readonly type?: string;
  /** The default in words, where the schema has none of its own (another field's, or one left unset for older readers). */
  readonly default?: string;
  /** Markdown after the description: a link, mostly. */
  readonly more?: string;
}

/** The `FieldDoc`s of a schema's fields, by name (`parent.child` for an expanded object's). */
type FieldDocs<Field extends string> = Readonly<Partial<Record<Field, FieldDoc>>>;

/** A subject token, as the docs say it: agent, pool, job and user names are tokens (`TOKEN_PATTERN`). */
const TOKEN = "1 to 64 of `A-Z a-z 0-9 _ -`";
const TIMEOUT = "duration, 100 ms to 7 days";

const AGENT_DOCS: FieldDocs<keyof AgentDefinitionInput> = {
  name: { type: TOKEN },
  command: { type: "string, or list of strings", more: " ([`command`](#command))" },
  pool: { type: TOKEN },
  // Not a schema default: a definition that does not set it stays readable by releases before priorities.
  priority: { default: "`normal`", more: " ([priority](architecture.md#priorities))" },
  runtime: { type: "object", default: "see below" },
  trusted: { more: " ([security](security.md))" },
  env: { type: "map of variable name to string" },
  // zod leaves a default out of the JSON Schema when the items are transformed, as a secret's name is.
  secrets: { type: "list", default: "`[]`", more: " ([`secrets`](#secrets))" },
  outputs: { type: "list of globs", more: " ([`outputs`](#outputs))" },
  handoffs: { type: "list of agent names", more: " ([Handing off](#handing-off))" },
  retry: { type: "retry policy", more: " ([reliability](reliability.md#retries))" },
  inputSchema: { type: "JSON Schema", more: " ([Input schema](#input-schema))" },
};

const RUNTIME_DOCS: FieldDocs<keyof RuntimeWishes | `limits.${keyof ResourceLimits}`> = {
  network: { type: "`none`, `bridge` or a Docker network name" },
  timeout: { type: TIMEOUT, default: "`10m`" },
  queueTimeout: { type: TIMEOUT, more: " ([reliability](reliability.md#queue-time-expiry))" },
  "limits.memory": { type: "size, 4 MiB to 1 TiB" },
  // Not a schema default, as for the agent's priority.
  warm: { default: "`false`", more: " ([docker.md](docker.md#a-warm-pool))" },
};

const SPEC_DOCS: FieldDocs<keyof JobSpecInput> = {
  agent: { type: "agent name", default: "required (on the intake stream: taken from the subject)" },
  input: { type: "any JSON" },
  files: { more: " ([input files](#input-files))" },
  timeout: { type: TIMEOUT, default: "the agent's `runtime.timeout`" },
  queueTimeout: {
    type: TIMEOUT,
    default: "the agent's `runtime.queueTimeout` (none)",
    more: " ([reliability](reliability.md#queue-time-expiry))",
  },
  deadline: { type: "duration, 1 s to 7 days", more: " ([reliability](reliability.md#an-overall-deadline-across-attempts))" },
  pool: { type: "pool name", default: "the agent's `pool`" },
  priority: { default: "the agent's `priority` (`normal`)", more: " ([priority](architecture.md#priorities))" },
  retry: { default: "the agent's `retry` (none: no retries)", more: " ([reliability](reliability.md#retries))" },
  labels: { type: "object of string (key at most 64 characters) to string (at most 256)" },
  chainLimits: {
    default: `${DEFAULT_CHAIN_LIMITS.maxHops} hops, ${DEFAULT_CHAIN_LIMITS.maxVisits} jobs per agent, no deadline`,
    more: " ([workflows](workflows.md#limits))",
  },
  session: { type: "session id", default: "none: a fresh sandbox", more: " ([sessions](sessions.md#jobs-in-a-session))" },
  runAt: { type: "ISO 8601 time", default: "none: now", more: " ([flow control](flow-control.md#delayed-jobs))" },
  delay: { type: "duration, up to 30 days", default: "none: now", more: " ([flow control](flow-control.md#delayed-jobs))" },
};

const RECORD_DOCS: FieldDocs<keyof JobRecord> = {
  state: { type: "job state", more: " (see below)" },
  spec: { type: "job spec" },
  chain: { more: " ([workflows.md](workflows.md#the-chain-link))" },
  traceparent: { more: " ([observability](observability.md#traces))" },
};

/** The rows of a table of what people write: field, type, default, meaning. `expand` lists object fields shown as `field.child` rows. */
function writtenRows(schema: JsonSchema, docs: FieldDocs<string>, expand: readonly string[] = []): string[][] {
  return fields(schema, expand).map(({ name, field, required }) => {
    const doc = docs[name] ?? {};
    const fallback = required ? "required" : "none";
    const value =
      field.default === undefined
        ? fallback
        : typeof field.default === "string"
          ? `\`${field.default}\``
          : `\`${JSON.stringify(field.default)}\``;
    return [`\`${name}\``, doc.type ?? typeText(name, field), doc.default ?? value, meaning(name, field, doc)];
  });
}

/** The rows of a table of what Boxcar stores: field, type (saying when it may be absent), meaning. */
function storedRows(schema: JsonSchema, docs: FieldDocs<string>): string[][] {
  return fields(schema).map(({ name, field, required }) => {
    const doc = docs[name] ?? {};
    const type = doc.type ?? typeText(name, field);
    return [`\`${name}\``, required ? type : `${type}, optional`, meaning(name, field, doc)];
  });
}

function fields(schema: JsonSchema, expand: readonly string[] = []): { name: string; field: JsonSchema; required: boolean }[] {
  return Object.entries(schema.properties ?? {}).flatMap(([name, field]) =>
    expand.includes(name)
      ? fields(field, []).map((child) => ({ ...child, name: `${name}.${child.name}` }))
      : [{ name, field, required: schema.required?.includes(name) ?? false }],
  );
}

function meaning(name: string, field: JsonSchema, doc: FieldDoc): string {
  if (!field.description) throw new Error(`${name} has no description: give it one with .describe() in its zod schema`);
  return `${field.description}${doc.more ?? ""}`;
}

/** A JSON Schema, as far as the tables read one. */
interface JsonSchema {
  type?: string | string[];
  const?: unknown;
  enum?: unknown[];
  format?: string;
  minLength?: number;
  maxLength?: number;
  minimum?: number;
  exclusiveMinimum?: number;
  maximum?: number;
  maxItems?: number;
  default?: unknown;
  description?: string;
  properties?: Record<string, JsonSchema>;
  required?: string[];
  items?: JsonSchema;
}

/** The type of `field` in words, from its JSON Schema; throws when it needs a `FieldDoc` type instead. */
function typeText(name: string, field: JsonSchema): string {
  const code = (value: unknown) => `\`${typeof value === "string" ? value : JSON.stringify(value)}\``;
  if (field.const !== undefined) return code(field.const);
  if (field.enum) return oneOf(field.enum.map(code));
  if (field.type === "boolean") return "boolean";
  if (field.type === "string") {
    if (field.format === "date-time") return "time";
    if (field.maxLength === undefined) return "string";
    return field.minLength
      ? `string, ${field.minLength} to ${field.maxLength} characters`
      : `string, at most ${field.maxLength} characters`;
  }
  if (field.type === "integer" || field.type === "number") {
    // zod gives every integer the largest safe one as its maximum: no bound worth printing.
    const max = field.maximum !== undefined && field.maximum < Number.MAX_SAFE_INTEGER ? field.maximum : undefined;
    if (max === undefined) return field.type;
    if (field.exclusiveMinimum !== undefined) return `${field.type} above ${field.exclusiveMinimum}, at most ${spaced(max)}`;
    return field.minimum !== undefined
      ? `${field.type}, ${spaced(field.minimum)} to ${spaced(max)}`
      : `${field.type}, at most ${spaced(max)}`;
  }
  if (field.type === "object" && field.properties) return shape(field);
  if (field.type === "array") {
    const items = field.items?.type === "object" && field.items.properties ? `array of ${shape(field.items)}` : "array";
    return field.maxItems === undefined ? items : `${items}, at most ${spaced(field.maxItems)}`;
  }
  throw new Error(`no plain type for ${name}: give it one in its FieldDoc`);
}

/** An object's fields as `{a, b?}`, `?` on those it may lack. */
function shape(object: JsonSchema): string {
  return `\`{${Object.keys(object.properties ?? {})
    .map((key) => (object.required?.includes(key) ? key : `${key}?`))
    .join(", ")}}\``;
}

/** `a`, `a or b`, `a, b or c`. */
function oneOf(items: readonly string[]): string {
  return items.length < 2 ? (items[0] ?? "") : `${items.slice(0, -1).join(", ")} or ${items.at(-1)}`;
}

/** 1000000 as `1 000 000`, as the docs write large numbers; smaller than 10 000 as is. */
function spaced(n: number): string {
  return n < 10_000 ? String(n) : String(n).replace(/\B(?=(\d{3})+$)/g, " ");
}

function jobStatesTable(): string {
  const rows = Object.entries(JOB_STATE_DOCS).map(([state, meaning]) => [
    `\`${state}\``,
    TERMINAL_STATES.has(state as JobState) ? "yes" : "no",
    meaning,
  ]);
  return markdownTable(["state", "final", "meaning"], rows);
}

function errorCodesTable(): string {
  const rows = Object.entries(ERROR_CODE_DOCS).map(([code, { meaning, appears }]) => [
    `\`${code}\``,
    String(ERROR_STATUS[code as ErrorCode] ?? ""),
    meaning,
    appears,
  ]);
  return markdownTable(["code", "status", "meaning", "where it appears"], rows);
}

/**
 * Fills in the variable parts of a name: with `<placeholder>` for a pattern, or with the example.
 * A placeholder is not a value of the part's type (a role, a priority), but `names()` only pastes
 * it into a string.
 */
type Part = <T extends string>(placeholder: string, example: T) => T;
const placeholder: Part = <T extends string>(name: string) => `<${name}>` as T;
const example: Part = (_, value) => value;

/** One name Boxcar uses on NATS, and what kind of thing it names. */
interface NameRow {
  readonly what: string;
  readonly name: (n: Names, part: Part) => string;
  readonly kind: (n: Names) => string;
}

/** The kind of a subject kept on `stream`. */
const keptOn = (stream: keyof Names["streams"]) => (n: Names) => `stream \`${n.streams[stream]}\``;
const streamKind = () => "JetStream stream";

/** Every stream and bucket and the subjects a client meets, in the order the tables list them. */
const NAME_ROWS: readonly NameRow[] = [
  {
    what: "API request",
    name: (n, x) => n.subjects.api({ role: x("role", "admin"), user: x("user", LOCAL_OWNER) }, x("endpoint", ApiEndpoint.jobsSubmit)),
    kind: (n) => `request to the NATS service \`${n.serviceName}\``,
  },
  {
    what: "API endpoint subject",
    name: (n, x) => n.subjects.apiEndpoint(x("endpoint", ApiEndpoint.jobsSubmit)),
    kind: () => "what the dispatchers listen on, in the queue group `q`",
  },
  { what: "service name", name: (n) => n.serviceName, kind: () => "the dispatchers' NATS service (`$SRV.PING`, `$SRV.INFO`)" },
  { what: "intake subject", name: (n, x) => n.subjects.submit(x("user", LOCAL_OWNER), x("agent", "hello")), kind: keptOn("submit") },
  { what: "intake stream", name: (n) => n.streams.submit, kind: streamKind },
  { what: "work subject", name: (n, x) => n.subjects.work(x("pool", "default")), kind: keptOn("work") },
  {
    what: "work subject, `high` or `low`",
    name: (n, x) => n.subjects.work(x("pool", "default"), x("high|low", "high")),
    kind: keptOn("work"),
  },
  {
    what: "a delayed job's marker",
    name: (n, x) => n.subjects.laterWork(x("jobId", "<jobId>")),
    kind: keptOn("work"),
  },
  {
    what: "a job waiting for a place under a concurrency limit",
    name: (n, x) => n.subjects.heldWork(`${x("agent", "hello")}.${x("value", "all")}`, x("jobId", "<jobId>")),
    kind: keptOn("work"),
  },
  {
    what: "a job waiting for a place under a pool's concurrency limit",
    name: (n, x) => n.subjects.heldWork(`=pool.${x("pool", "default")}`, x("jobId", "<jobId>")),
    kind: keptOn("work"),
  },
  {
    what: "work subject of a worker's sessions",
    name: (n, x) => n.subjects.sessionWork(x("workerId", "w-1")),
    kind: keptOn("work"),
  },
  { what: "work stream", name: (n) => n.streams.work, kind: streamKind },
  {
    what: "job events",
    name: (n, x) => n.subjects.event("job", x("jobId", "<jobId>"), x("type", "queued"), x("owner", "<owner>")),
    kind: keptOn("events"),
  },
  {
    what: "sandbox events",
    name: (n, x) => n.subjects.event("sandbox", x("jobId", "<jobId>"), x("type", "ready"), x("owner", "<owner>")),
    kind: keptOn("events"),
  },
  {
    what: "workflow run events",
    name: (n, x) => n.subjects.event("workflow", x("runId", "<runId>"), x("type", "started"), x("owner", "<owner>")),
    kind: keptOn("events"),
  },
  {
    what: "worker events",
    name: (n, x) => n.subjects.event("worker", x("workerId", "<workerId>"), x("type", "heartbeat")),
    kind: keptOn("events"),
  },
  { what: "events stream", name: (n) => n.streams.events, kind: streamKind },
  {
    what: "agent output",
    name: (n, x) => n.subjects.log(x("owner", "<owner>"), x("jobId", "<jobId>"), x("stdout|stderr", "stdout")),
    kind: keptOn("logs"),
  },
  { what: "logs stream", name: (n) => n.streams.logs, kind: streamKind },
  { what: "dead-letter subject", name: (n, x) => n.subjects.dead(x("agent", "hello")), kind: keptOn("dead") },
  { what: "dead-letter stream", name: (n) => n.streams.dead, kind: streamKind },
  { what: "cancel subject", name: (n, x) => n.subjects.cancel(x("jobId", "<jobId>")), kind: () => "core NATS subject, not stored" },
  {
    what: "an input file's chunks",
    name: (n, x) => n.subjects.upload(x("user", LOCAL_OWNER), x("token", "<token>")),
    kind: () => "core NATS subject, to one dispatcher",
  },
  {
    what: "a session's requests to its worker",
    name: (n, x) => n.subjects.session(x("workerId", "<workerId>"), "<op>"),
    kind: () => "core NATS subject, from dispatchers to one worker",
  },
  {
    what: "a tunnel's bytes into a session's port or shell",
    name: (n, x) => n.subjects.tunnel(x("user", LOCAL_OWNER), x("tunnelId", "<tunnelId>"), "in"),
    kind: () => "core NATS subject, from its user to the session's worker",
  },
  {
    what: "a tunnel's bytes out of a session's port or shell",
    name: (n, x) => n.subjects.tunnel(x("user", LOCAL_OWNER), x("tunnelId", "<tunnelId>"), "out"),
    kind: () => "core NATS subject, from the session's worker to its user",
  },
  { what: "job records", name: (n) => n.buckets.jobs, kind: () => "KV bucket, key = job id" },
  { what: "agent definitions", name: (n) => n.buckets.agents, kind: () => "KV bucket, key = agent name" },
  { what: "worker presence", name: (n) => n.buckets.workers, kind: () => "KV bucket, key = worker id" },
  { what: "idempotency keys", name: (n) => n.buckets.idempotency, kind: () => "KV bucket, key = SHA-256 of the key (hex)" },
  { what: "workflow runs", name: (n) => n.buckets.workflows, kind: () => "KV bucket, key = run id" },
  { what: "system policy", name: (n) => n.buckets.policy, kind: () => "KV bucket, one key: `system`" },
  { what: "session records", name: (n) => n.buckets.sessions, kind: () => "KV bucket, key = session id" },
  {
    what: "rate and concurrency limits' state",
    name: (n) => n.buckets.limits,
    kind: () =>
      "KV bucket, key = agent name (and a digest of the key's value); `=places.` before them for concurrency (`=places.=pool.<pool>` for a pool's)",
  },
  { what: "schedules", name: (n) => n.buckets.schedules, kind: () => "KV bucket, key = `<owner>.<name>`" },
  { what: "usage per day", name: (n) => n.buckets.usage, kind: () => "KV bucket, key = `<day>.agent.<name>` or `<day>.user.<name>`" },
  {
    what: "model calls per limit and window",
    name: (n) => n.buckets.modelUse,
    kind: () =>
      "KV bucket, key = `<provider>.<model>.<per>.<window>` (the model in base64url, `_` for a whole provider), written by workers' model gateways",
  },
  { what: "session snapshots", name: (n) => n.buckets.snapshots, kind: () => "Object Store, name = snapshot id" },
  {
    what: "job index snapshots",
    name: (n) => n.buckets.jobIndex,
    kind: () => "Object Store, name = `jobs-<sequence>`, written by dispatchers",
  },
  { what: "input files and artifacts", name: (n) => n.buckets.artifacts, kind: () => "Object Store" },
  { what: "reply inboxes", name: (n, x) => n.inboxPrefix(x("user", LOCAL_OWNER)), kind: () => "inbox prefix of every connection" },
];

/** A name pattern: the name with placeholders, the prefix written `<prefix>` (`<PREFIX>` in stream names). */
function pattern(row: NameRow): string {
  return row
    .name(names(DEFAULT_PREFIX), placeholder)
    .replaceAll(DEFAULT_PREFIX, "<prefix>")
    .replaceAll(DEFAULT_PREFIX.toUpperCase(), "<PREFIX>");
}

/** For nats-api.md: each name's pattern, and examples with the default prefix and another. */
function namesTable(): string {
  const other = "acme-ci";
  const rows = NAME_ROWS.map((row) => [
    row.what,
    `\`${pattern(row)}\``,
    `\`${row.name(names(DEFAULT_PREFIX), example)}\``,
    `\`${row.name(names(other), example)}\``,
  ]);
  return markdownTable(["what", "pattern", "with the default prefix", `with prefix \`${other}\``], rows);
}

/** The units durations and sizes are written in, as the parser reads them (units.ts). */
function unitsTable(): string {
  const count = (n: number) => n.toLocaleString("en-US").replaceAll(",", " ");
  const durations = Object.entries(DURATION_UNIT_MS).map(([unit, ms]) => [`duration`, `\`${unit}\``, `${count(ms)} ms`]);
  const sizes = Object.entries(SIZE_UNIT).map(([unit, bytes]) => [`size`, `\`${unit}\``, `${count(bytes)} byte${bytes === 1 ? "" : "s"}`]);
  return markdownTable(["of a", "unit", "is"], [...durations, ...sizes]);
}

/** For architecture.md: each name with the default prefix, and what kind of thing it names. */
function namesKindTable(): string {
  const n = names(DEFAULT_PREFIX);
  const rows = NAME_ROWS.map((row) => [row.what, `\`${row.name(n, placeholder)}\``, row.kind(n)]);
  return markdownTable(["what", "default name", "kind"], rows);
}

/**
 * A Markdown table, unpadded: Biome pads the cells when it formats the doc (`pnpm docs:tables`
 * runs it), and the test compares tables without their padding. A `|` in a cell is escaped, as
 * GitHub's Markdown needs even inside code.
 */
function markdownTable(header: readonly string[], rows: readonly (readonly string[])[]): string {
  const line = (cells: readonly string[]) => `| ${cells.map((cell) => cell.replaceAll("|", "\\|")).join(" | ")} |`;
  return [line(header), line(header.map(() => "---")), ...rows.map(line)].join("\n");
}
