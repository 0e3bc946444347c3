/**
 * Reading a backup before anything is restored (docs/backup.md): `readBackupPlan` reads the whole
 * file through once and checks every line, stream name, subject, sequence and count against the
 * prefix, and makes it a `BackupPlan`: each stream's saved config, its sequences, and how many
 * messages it keeps once they are published again; and the subject of the placeholders that fill
 * its missing sequences (`gapSubject`).
 */

import { names as namesFor } from "@boxcar/protocol";
import type { z } from "zod";
import {
  BACKUP_FORMAT,
  BACKUP_VERSION,
  BackupFileError,
  checked,
  DoneLine,
  dataOf,
  EndLine,
  Header,
  headerBytes,
  linesOf,
  Message,
  parseLine,
  StreamLine,
} from "./format.js";
import { type SystemStream, subjectMatches, systemStreams } from "./streams.js";

/** One stream as a backup holds it, checked. */
export interface PlannedStream {
  name: string;
  kind: SystemStream["kind"];
  subjects: readonly string[];
  config: Record<string, unknown>;
  /** Its first message's sequence; `lastSeq + 1` when it has none. */
  firstSeq: number;
  lastSeq: number;
  messages: number;
  bytes: number;
  /** How many messages the stream holds once they are all published again (its limits per subject and rollups applied). */
  kept: number;
}

/** A backup file, read through once and checked, ready to restore. */
export interface BackupPlan {
  file: string;
  prefix: string;
  createdAt: string;
  streams: PlannedStream[];
  messages: number;
}

/** The subject the placeholders for missing sequences go to: one no Boxcar message uses. */
export function gapSubject(stream: PlannedStream): string {
  return (stream.subjects[0] as string).replace(/>$/, "~boxcar-restore-gap");
}

/**
 * Reads a backup through once and checks all of it: that it is a complete backup of this format
 * version, of `prefix`, of streams of that prefix only, each with the subjects its kind has, each
 * message on one of its stream's subjects, in order, and the counts its trailers give. Holds no
 * message in memory (a count per subject, for streams with a limit per subject).
 */
export async function readBackupPlan(file: string, prefix: string): Promise<BackupPlan> {
  const known = new Map(systemStreams(prefix).map((s) => [s.name, s]));
  let header: z.infer<typeof Header> | undefined;
  const streams: PlannedStream[] = [];
  let current:
    | { plan: PlannedStream; lastSeen: number; counts: Map<string, number> | undefined; perSubject: number; rollups: boolean }
    | undefined;
  let done: z.infer<typeof DoneLine> | undefined;
  let total = 0;
  for await (const { n, text } of linesOf(file)) {
    const value = parseLine(file, n, text);
    if (n === 1) {
      const v = value as { format?: unknown; version?: unknown; prefix?: unknown };
      if (typeof value !== "object" || value === null || v.format !== BACKUP_FORMAT) {
        throw new BackupFileError(`${file} is not a Boxcar backup: its first line does not say format ${JSON.stringify(BACKUP_FORMAT)}`);
      }
      if (v.version !== BACKUP_VERSION) {
        throw new BackupFileError(
          `${file} is a backup in format version ${JSON.stringify(v.version)}; this boxcar reads version ${BACKUP_VERSION} only`,
        );
      }
      header = checked(Header, value, file, n, "header");
      if (header.prefix !== prefix) {
        throw new BackupFileError(
          `${file} is a backup of the system with prefix ${header.prefix}, not ${prefix}: restore it with --prefix ${header.prefix}`,
        );
      }
      continue;
    }
    if (done) throw new BackupFileError(`${file} is corrupt: line ${n} comes after the line that ends the backup`);
    const type = typeof value === "object" && value !== null ? (value as { type?: unknown }).type : undefined;
    if (type === "stream") {
      if (current) throw new BackupFileError(`${file} is corrupt: line ${n} starts a stream before ${current.plan.name} ended`);
      const line = checked(StreamLine, value, file, n, "stream line");
      const system = known.get(line.name);
      if (!system) {
        throw new BackupFileError(
          `${file} holds a stream ${line.name}, which is not one of a Boxcar system with prefix ${prefix}: refused`,
        );
      }
      if (streams.some((s) => s.name === line.name)) throw new BackupFileError(`${file} is corrupt: it holds stream ${line.name} twice`);
      const subjects = [...line.config.subjects].sort();
      if (line.config.name !== line.name || subjects.join(" ") !== [...system.subjects].sort().join(" ")) {
        throw new BackupFileError(
          `${file} gives stream ${line.name} the subjects ${line.config.subjects.join(", ")}; a Boxcar system's has ${system.subjects.join(", ")}: refused`,
        );
      }
      for (const field of ["mirror", "sources"] as const) {
        if (line.config[field])
          throw new BackupFileError(`${file} gives stream ${line.name} a ${field}: a Boxcar stream has none; refused`);
      }
      const perSubject = Number(line.config.max_msgs_per_subject ?? 0);
      const rollups = line.config.allow_rollup_hdrs === true;
      current = {
        plan: {
          name: line.name,
          kind: system.kind,
          subjects: system.subjects,
          config: line.config,
          firstSeq: 0,
          lastSeq: 0,
          messages: 0,
          bytes: 0,
          kept: 0,
        },
        lastSeen: 0,
        counts: perSubject > 0 || rollups ? new Map() : undefined,
        perSubject,
        rollups,
      };
      continue;
    }
    if (!current) {
      if (type === "done") {
        done = checked(DoneLine, value, file, n, "closing line");
        continue;
      }
      throw new BackupFileError(`${file} is corrupt: line ${n} is not a stream's first line`);
    }
    if (type === "end") {
      const end = checked(EndLine, value, file, n, "stream trailer");
      const plan = current.plan;
      if (end.stream !== plan.name || end.messages !== plan.messages || end.lastSeq < current.lastSeen) {
        throw new BackupFileError(
          `${file} is corrupt: stream ${plan.name} has ${plan.messages} messages up to sequence ${current.lastSeen}, its trailer says ${end.messages} up to ${end.lastSeq}`,
        );
      }
      plan.lastSeq = end.lastSeq;
      if (plan.messages === 0) plan.firstSeq = end.lastSeq + 1;
      streams.push(plan);
      current = undefined;
      continue;
    }
    if (type !== undefined) throw new BackupFileError(`${file} is corrupt: line ${n} has an unknown type ${JSON.stringify(type)}`);
    const msg = checked(Message, value, file, n, "message");
    const plan = current.plan;
    if (msg.seq <= current.lastSeen) {
      throw new BackupFileError(`${file} is corrupt: line ${n} has sequence ${msg.seq} after ${current.lastSeen} in stream ${plan.name}`);
    }
    if (!plan.subjects.some((f) => subjectMatches(f, msg.subject)) || msg.subject === gapSubject(plan)) {
      throw new BackupFileError(
        `${file} holds a message on ${msg.subject} in stream ${plan.name}, which does not take that subject: refused`,
      );
    }
    if (plan.messages === 0) plan.firstSeq = msg.seq;
    current.lastSeen = msg.seq;
    plan.messages += 1;
    plan.bytes += dataOf(msg).length + headerBytes(msg.headers);
    total += 1;
    keep(current, msg);
  }
  if (!header) throw new BackupFileError(`${file} is not a Boxcar backup: it is empty`);
  if (current || !done) {
    throw new BackupFileError(
      `${file} is truncated: it ends ${current ? `inside stream ${current.plan.name}` : "before the line that closes a complete backup"}`,
    );
  }
  if (done.streams !== streams.length || done.messages !== total) {
    throw new BackupFileError(
      `${file} is corrupt: it holds ${streams.length} streams and ${total} messages, its last line says ${done.streams} and ${done.messages}`,
    );
  }
  if (header.streams.join(" ") !== streams.map((s) => s.name).join(" ")) {
    throw new BackupFileError(`${file} is corrupt: its header lists other streams (${header.streams.join(", ")}) than it holds`);
  }
  const work = namesFor(prefix).streams.work;
  if (!streams.some((s) => s.name === work)) throw new BackupFileError(`${file} has no ${work} stream: it is not a whole system's backup`);
  return { file, prefix, createdAt: header.createdAt, streams, messages: total };
}

/** Counts what a stream keeps of `msg` and what came before: its limit per subject, and rollups, as JetStream applies them. */
function keep(
  current: { plan: PlannedStream; counts: Map<string, number> | undefined; perSubject: number; rollups: boolean },
  msg: Message,
) {
  const { plan, counts } = current;
  if (!counts) {
    plan.kept += 1;
    return;
  }
  const rollup = current.rollups ? headerOf(msg, "Nats-Rollup")?.toLowerCase() : undefined;
  if (rollup === "all") {
    counts.clear();
    plan.kept = 0;
  } else if (rollup === "sub") {
    plan.kept -= counts.get(msg.subject) ?? 0;
    counts.delete(msg.subject);
  }
  const count = (counts.get(msg.subject) ?? 0) + 1;
  plan.kept += 1;
  if (current.perSubject > 0 && count > current.perSubject) {
    plan.kept -= 1;
    counts.set(msg.subject, current.perSubject);
  } else counts.set(msg.subject, count);
}

function headerOf(msg: Message, name: string): string | undefined {
  const key = Object.keys(msg.headers ?? {}).find((k) => k.toLowerCase() === name.toLowerCase());
  return key ? msg.headers?.[key]?.[0] : undefined;
}
