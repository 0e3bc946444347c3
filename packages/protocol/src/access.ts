/**
 * Who may do what. A caller is a principal: a user name under one role. NATS vouches for it: a
 * user's credential lets it publish API requests only on `<prefix>.api.<role>.<user>.>`, so the
 * role and user a dispatcher reads from a request's subject are the credential's own. The
 * permissions below are derived from the names in `names.ts`, so they cannot drift from them;
 * `boxcar auth` renders them into user credentials (as permission templates on each role's
 * signing key) and `docs/security.md` prints them.
 *
 * Submitters and viewers get no JetStream at all, and may publish on no subject a stream or
 * JetStream's API listens on: JetStream sends its publish acks, pulled messages and API replies
 * to whatever reply subject the publisher names, without checking it against the publisher's
 * permissions, so any such publish could be aimed at (say) a stream's purge. They call the
 * dispatchers' API, which answers only on the caller's own inboxes (`mayReplyTo`), and subscribe
 * to their own live events.
 */

import { z } from "zod";
import { ApiEndpoint, LOCAL_OWNER, type Names, TOKEN_PATTERN } from "./names.js";
import { type Identity, ROLES, Role } from "./principal.js";

/** A user name: a subject token, so it can sit in subjects and permission templates. */
export const UserName = z.string().regex(TOKEN_PATTERN, "a user name is 1-64 letters, digits, '-' or '_'");

/**
 * The principal of a connection to a NATS server without authentication (`boxcar up` on
 * 127.0.0.1): anyone who reaches such a server can do anything, so its callers are admins.
 */
export const OPEN_IDENTITY: Identity = { role: "admin", user: LOCAL_OWNER };

/** Parses `role:user`, as in `BOXCAR_IDENTITY`. */
export function parseIdentity(text: string): Identity {
  const [role, user, ...rest] = text.split(":");
  const r = Role.safeParse(role);
  if (!r.success || rest.length > 0 || !UserName.safeParse(user).success) {
    throw new RangeError(
      `an identity is ROLE:USER with ROLE one of ${ROLES.join(", ")} and USER a name of letters, digits, '-' or '_', got ${JSON.stringify(text)}`,
    );
  }
  return { role: r.data, user: user as string };
}

/** The tag on a user credential that names its role (informative: its signing key fixes what it may do). */
export const ROLE_TAG = "boxcar-role";

/** The endpoints that only read: a viewer's, and those no trace is begun for (docs/observability.md#traces). */
export const READ_ENDPOINTS: readonly ApiEndpoint[] = [
  ApiEndpoint.jobsGet,
  ApiEndpoint.jobsList,
  ApiEndpoint.jobsCount,
  ApiEndpoint.agentsGet,
  ApiEndpoint.agentsList,
  ApiEndpoint.workersList,
  ApiEndpoint.workflowsGet,
  ApiEndpoint.workflowsList,
  ApiEndpoint.jobsEvents,
  ApiEndpoint.jobsLogs,
  ApiEndpoint.jobsArtifact,
  ApiEndpoint.workflowsEvents,
  ApiEndpoint.sessionsGet,
  ApiEndpoint.sessionsList,
  ApiEndpoint.sessionsEvents,
  ApiEndpoint.sessionsLogs,
  ApiEndpoint.sessionsProcesses,
  ApiEndpoint.sessionsOutput,
  ApiEndpoint.snapshotsList,
  ApiEndpoint.schedulesGet,
  ApiEndpoint.schedulesList,
  ApiEndpoint.usageGet,
];

/**
 * The API endpoints each role may call. Dispatchers and workers call none: they work on the
 * streams and buckets. Only an admin applies or removes agents and sets the policy, because an
 * agent's definition decides what runs on workers (trusted host processes, secrets, networks).
 */
export const ROLE_ENDPOINTS: Readonly<Record<Role, readonly ApiEndpoint[]>> = {
  admin: Object.values(ApiEndpoint),
  dispatcher: [],
  worker: [],
  submitter: [
    ...READ_ENDPOINTS,
    ApiEndpoint.jobsSubmit,
    ApiEndpoint.jobsCancel,
    ApiEndpoint.jobsRetry,
    ApiEndpoint.jobsRerun,
    ApiEndpoint.workflowsStart,
    ApiEndpoint.workflowsCancel,
    ApiEndpoint.inputsUpload,
    ApiEndpoint.sessionsOpen,
    ApiEndpoint.sessionsExec,
    ApiEndpoint.sessionsClose,
    ApiEndpoint.sessionsCancel,
    ApiEndpoint.sessionsStart,
    ApiEndpoint.sessionsWait,
    ApiEndpoint.sessionsKill,
    ApiEndpoint.sessionsInput,
    ApiEndpoint.sessionsFilesRead,
    ApiEndpoint.sessionsFilesWrite,
    ApiEndpoint.sessionsFilesList,
    ApiEndpoint.sessionsFilesRemove,
    ApiEndpoint.sessionsFilesStat,
    ApiEndpoint.sessionsWatch,
    ApiEndpoint.sessionsUnwatch,
    // A tunnel's bytes go both ways (a connection can write): its owner's (and an admin's), never a viewer's.
    ApiEndpoint.sessionsConnect,
    // A shell writes (its keys run commands): its owner's (and an admin's), never a viewer's.
    ApiEndpoint.sessionsShell,
    // Holding a session's processes still, and letting them go on: its owner's (and an admin's), never a viewer's.
    ApiEndpoint.sessionsPause,
    ApiEndpoint.sessionsResume,
    ApiEndpoint.sessionsSnapshot,
    ApiEndpoint.snapshotsRemove,
    ApiEndpoint.schedulesCreate,
    ApiEndpoint.schedulesUpdate,
    ApiEndpoint.schedulesPause,
    ApiEndpoint.schedulesResume,
    ApiEndpoint.schedulesDelete,
    // Whether the caller may decide is the step's to say (its approvers).
    ApiEndpoint.workflowsApprove,
    ApiEndpoint.jobsSignal,
    ApiEndpoint.workflowsSignal,
  ],
  viewer: [...READ_ENDPOINTS, ApiEndpoint.policyGet],
};

/** Whether `role` sees every principal's jobs and runs (else only its own). */
export function seesAll(role: Role): boolean {
  return role === "admin" || role === "viewer" || role === "dispatcher";
}

/** Subjects a user may publish and subscribe to. `allowResponses`: may answer requests sent to it. */
export interface SubjectPermissions {
  readonly pub: { readonly allow: readonly string[]; readonly deny: readonly string[] };
  readonly sub: { readonly allow: readonly string[]; readonly deny: readonly string[] };
  readonly allowResponses: boolean;
}

/** Stands for the user's name in permissions: NATS fills it in from the user's credential. */
export const USER_TEMPLATE = "{{name()}}";

/** The JetStream API operations a role may use on one stream. */
type StreamAccess = "consume" | "manage";

/**
 * The permissions of `role` on the system named by `names`. `user` is the user's name, or the
 * template that stands for it.
 */
export function rolePermissions(names: Names, role: Role, user: string = USER_TEMPLATE): SubjectPermissions {
  const s = names.subjects;
  const b = names.buckets;
  const st = names.streams;
  const kv = (bucket: string) => `KV_${bucket}`;
  const obj = (bucket: string) => `OBJ_${bucket}`;
  const kvSubjects = (bucket: string) => `$KV.${bucket}.>`;
  const objSubjects = (bucket: string) => `$O.${bucket}.>`;
  const allStreams = [
    st.submit,
    st.work,
    st.events,
    st.logs,
    st.dead,
    kv(b.jobs),
    kv(b.agents),
    kv(b.workers),
    kv(b.idempotency),
    kv(b.workflows),
    obj(b.artifacts),
    kv(b.policy),
    kv(b.sessions),
    obj(b.snapshots),
  ];
  const inbox = `${names.inboxPrefix(user)}.>`;
  const common = ["$JS.API.INFO", ...allStreams.map((stream) => `$JS.API.STREAM.INFO.${stream}`)];

  switch (role) {
    case "admin":
      return { pub: { allow: [">"], deny: [] }, sub: { allow: [">"], deny: [] }, allowResponses: true };
    case "dispatcher":
      return {
        pub: {
          allow: [
            ...common,
            ...allStreams.flatMap((stream) => streamApi(stream, "manage")),
            // Rate limits' state, the schedules and the job index's snapshots are the dispatchers'
            // alone (workers get no access to them).
            ...[kv(b.limits), kv(b.schedules), kv(b.usage), obj(b.jobIndex)].flatMap((stream) => [
              `$JS.API.STREAM.INFO.${stream}`,
              ...streamApi(stream, "manage"),
            ]),
            // The durable consumers they share: the intake, the delayed jobs' markers (work) and the
            // usage events (events), each message acked once summed.
            ...[st.submit, st.work, st.events].flatMap((stream) => streamApi(stream, "consume")),
            `$JS.API.STREAM.MSG.DELETE.${st.work}`,
            s.eventsAll,
            s.workAll,
            s.deadAll,
            s.cancelAll,
            s.signalAll,
            ...[b.jobs, b.agents, b.idempotency, b.workflows, b.policy, b.sessions, b.limits, b.schedules, b.usage].map(kvSubjects),
            // Requests to the worker that holds a session (it answers only what it is asked).
            s.sessionAll,
            objSubjects(b.artifacts),
            objSubjects(b.snapshots),
            objSubjects(b.jobIndex),
            // An object's chunks are removed by a purge filtered on them (deletes, overwrites),
            // and so are an ended job's events, output and record (and an ended run's) once its
            // retention is over, and an agent's rate limits' states when its limit changes.
            ...[obj(b.artifacts), obj(b.snapshots), obj(b.jobIndex), st.events, st.logs, kv(b.jobs), kv(b.workflows), kv(b.limits)].map(
              (stream) => `$JS.API.STREAM.PURGE.${stream}`,
            ),
            // A deleted record's revision and its delete marker go by their sequence (a purge by
            // subject scans the whole bucket).
            `$JS.API.STREAM.MSG.DELETE.${kv(b.jobs)}`,
            `$JS.API.STREAM.MSG.DELETE.${kv(b.workflows)}`,
            // Replies go only to inboxes: with leave to answer on any reply subject, a caller could
            // aim a dispatcher's reply at JetStream's API (say, a stream's purge).
            "_INBOX.>",
          ],
          deny: [],
        },
        sub: {
          allow: [inbox, s.apiAll, s.uploadsAll, "$SRV.>", `$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.${st.work}.>`],
          deny: [],
        },
        allowResponses: false,
      };
    case "worker":
      return {
        pub: {
          allow: [
            ...common,
            ...allStreams.flatMap((stream) => streamApi(stream, "manage")),
            ...streamApi(st.work, "consume"),
            s.eventsAll,
            s.logsAll,
            s.deadAll,
            kvSubjects(b.jobs),
            kvSubjects(b.workers),
            kvSubjects(b.sessions),
            // The model gateways' shared count of calls against the policy's model limits: the workers' alone.
            `$JS.API.STREAM.INFO.${kv(b.modelUse)}`,
            ...streamApi(kv(b.modelUse), "manage"),
            kvSubjects(b.modelUse),
            // The day's usage the dispatchers summed, read (never written) by the gateways, which
            // refuse a call once a budget that stops is spent.
            `$JS.API.STREAM.MSG.GET.${kv(b.usage)}`,
            objSubjects(b.artifacts),
            objSubjects(b.snapshots),
            `$JS.API.STREAM.PURGE.${obj(b.artifacts)}`,
            `$JS.API.STREAM.PURGE.${obj(b.snapshots)}`,
            // The bytes out of a session's ports, to the tunnel's user (core NATS; no stream listens there).
            s.tunnelsAll("out"),
          ],
          // Work items come only from dispatchers; a worker only hands them back.
          deny: [s.workAll],
        },
        // Session requests come from dispatchers; a worker may answer each once, on its reply subject only.
        // A tunnel's bytes into a session come from its user, and are never answered (their reply
        // subject is the sender's to choose).
        sub: { allow: [inbox, s.cancelAll, s.signalAll, s.sessionAll, s.tunnelsAll("in")], deny: [] },
        allowResponses: true,
      };
    case "viewer":
      // Reads everything through the API, changes nothing.
      return {
        pub: { allow: [`${s.apiPrincipal({ role, user })}.>`], deny: [] },
        sub: { allow: [inbox, s.eventsAll, s.logsAll], deny: [] },
        allowResponses: false,
      };
    case "submitter":
      // Everything through the API; live events and output only its own (their subjects carry the
      // owner); the bytes of its own tunnels to sessions' ports (core NATS, opened through the API).
      return {
        pub: { allow: [`${s.apiPrincipal({ role, user })}.>`, s.ownerUploads(user), s.tunnel(user, "*", "in")], deny: [] },
        sub: {
          allow: [inbox, ...OWNED_EVENT_KINDS.map((kind) => s.ownerEventsOf(kind, user)), s.ownerLogs(user), s.tunnel(user, "*", "out")],
          deny: [],
        },
        allowResponses: false,
      };
  }
}

/** The kinds of event that belong to a user (a worker's belong to no one). */
const OWNED_EVENT_KINDS = ["job", "sandbox", "workflow", "session"] as const;

/** `$JS.API` subjects for one stream: `consume` pulls and acks; `manage` also reads, creates and lists. */
function streamApi(stream: string, access: StreamAccess): string[] {
  const api = "$JS.API";
  const consume = [`${api}.CONSUMER.MSG.NEXT.${stream}.*`, `$JS.ACK.${stream}.>`];
  if (access === "consume") return consume;
  return [
    `${api}.DIRECT.GET.${stream}`,
    `${api}.DIRECT.GET.${stream}.>`,
    `${api}.STREAM.MSG.GET.${stream}`,
    // Ordered consumers: created with their filter in the subject, pulled, then deleted.
    `${api}.CONSUMER.CREATE.${stream}.>`,
    `${api}.CONSUMER.MSG.NEXT.${stream}.*`,
    `${api}.CONSUMER.INFO.${stream}.*`,
    `${api}.CONSUMER.DELETE.${stream}.*`,
    `${api}.STREAM.CREATE.${stream}`,
    `${api}.STREAM.NAMES`,
    `${api}.STREAM.LIST`,
    `${api}.CONSUMER.CREATE.${stream}`,
    `${api}.CONSUMER.DURABLE.CREATE.${stream}.*`,
    `${api}.CONSUMER.NAMES.${stream}`,
    `${api}.CONSUMER.LIST.${stream}`,
    // Flow control of a watch or ordered consumer (a KV watch of the jobs bucket): without these
    // replies the server stops delivering once a few MiB are pending.
    `$JS.FC.${stream}.>`,
  ];
}

/**
 * The principal of a request on `<prefix>.api.<role>.<user>.<endpoint>`. NATS permissions vouch
 * for it: no credential may publish under another role or user (an admin's may).
 */
export function callerOf(names: Names, subject: string): Identity | undefined {
  const rest = subject.startsWith(`${names.prefix}.api.`) ? subject.slice(names.prefix.length + 5).split(".") : [];
  const role = Role.safeParse(rest[0]);
  const user = rest[1];
  if (!role.success || user === undefined || !TOKEN_PATTERN.test(user)) return undefined;
  return { role: role.data, user };
}

/**
 * Whether a dispatcher may answer `caller` on `reply`: only on the caller's own inboxes
 * (`_INBOX.<user>.`), which nobody else may subscribe to; an admin's on any inbox (on a server
 * without authentication, clients in other languages use their library's default inboxes). Every
 * other subject is refused: a dispatcher may publish to records, events and control subjects,
 * and its answer must never land there.
 */
export function mayReplyTo(names: Names, caller: Identity, reply: string | undefined): boolean {
  if (!reply) return false;
  return reply.startsWith(`${names.inboxPrefix(caller.user)}.`) || (caller.role === "admin" && reply.startsWith("_INBOX."));
}

/** The owner and agent of an intake message on `<prefix>.submit.<owner>.<agent>`. */
export function intakeSubjectParts(names: Names, subject: string): { owner: string; agent: string } | undefined {
  const rest = subject.startsWith(`${names.prefix}.submit.`) ? subject.slice(names.prefix.length + 8).split(".") : [];
  const [owner, agent] = rest;
  if (rest.length !== 2 || owner === undefined || agent === undefined) return undefined;
  return { owner, agent };
}

/** The owner of a job record or workflow run; records from before owners belong to `local`. */
export function ownerOf(record: { readonly owner?: string | undefined }): string {
  return record.owner ?? LOCAL_OWNER;
}

/** Whether `caller` may see and act on what `owner` owns (its role permitting the request). */
export function mayAccess(caller: Identity, owner: string): boolean {
  return seesAll(caller.role) || caller.user === owner;
}

/**
 * The permissions of every role as a Markdown table, for `docs/security.md` (between the
 * `permissions` markers; `pnpm docs:permissions` rewrites it, and a test checks it is current).
 */
export function permissionsTable(n: Names): string {
  const cell = (subjects: readonly string[]) => (subjects.length === 0 ? "none" : subjects.map((x) => `\`${x}\``).join("<br>"));
  const rows = ROLES.map((role) => {
    const p = rolePermissions(n, role);
    const endpoints = ROLE_ENDPOINTS[role].length === Object.keys(ApiEndpoint).length ? "all" : ROLE_ENDPOINTS[role].join(", ") || "none";
    return `| ${role} | ${endpoints} | ${cell(p.pub.allow)}${p.pub.deny.length ? `<br>**denied:** ${cell(p.pub.deny)}` : ""} | ${cell(p.sub.allow)} | ${p.allowResponses ? "yes" : "no"} |`;
  });
  return ["| role | API endpoints | may publish | may subscribe | may reply |", "| --- | --- | --- | --- | --- |", ...rows].join("\n");
}
