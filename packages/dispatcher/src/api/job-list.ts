import type { Logger } from "@boxcar/common";
import type { Topology } from "@boxcar/fabric";
import { getJson } from "@boxcar/fabric/internal";
import { BoxcarError, type Identity, JobRecord, type ListJobsReply, ListJobsRequest, parseWith } from "@boxcar/protocol";
import { mayAccess } from "@boxcar/protocol/internal";
import type { IndexedJob, JobIndex } from "../jobs/job-index.js";
import { caughtUp, LIST_REPLY_BUDGET } from "../jobs/jobs.js";

/** The most records one list reads at once. */
const READ_BATCH = 250;

/**
 * `jobs.list`: pages through job records, newest first (job ids sort by creation time), up to
 * the limit or the byte budget of a reply. The dispatcher's job index says which jobs match and
 * how big each record is, in memory, so only the records the page can hold are read (`pageOf`),
 * and checked again: a job's state may have moved on. A record that does not read as one is left
 * out and logged, so it cannot break the list for everyone.
 */
export async function listJobs(
  topology: Topology,
  jobs: { index: JobIndex; caughtUp: Promise<void> },
  raw: unknown,
  caller: Identity,
  log: Logger,
): Promise<ListJobsReply> {
  const req = parseWith(ListJobsRequest, raw, "list request");
  await caughtUp(jobs);
  const matching = jobs.index.newestFirst(req.after, {
    owner: (owner) => mayAccess(caller, owner),
    ...(req.state ? { state: req.state } : {}),
    ...(req.agent ? { agent: req.agent } : {}),
    ...(req.pool ? { pool: req.pool } : {}),
  });
  const read = async (id: string): Promise<JobRecord | null> => {
    const found = await getJson(topology.jobs, id, JobRecord, "job record").catch((err: unknown) => {
      if (!(err instanceof BoxcarError || err instanceof SyntaxError)) throw err;
      log.warn({ err, jobId: id }, "unreadable job record left out of a list");
      return null;
    });
    if (!found || (req.state && found.value.state !== req.state)) return null;
    return found.value;
  };
  return pageOf(matching, read, req.limit, LIST_REPLY_BUDGET);
}

/**
 * One page of `candidates` (ids with the size the index has of their records, in list order):
 * reads the records that fit in `limit` and `budget` bytes by those sizes, a batch at a time,
 * and keeps those `read` still finds (null: gone, or no longer matching) while they fit by their
 * actual size; the first record is kept whatever its size. Once the page is full, the next
 * candidates are read one at a time until one is found: only then is there a `next` page (its
 * cursor, the page's last id). So a page of big records reads a few more than it returns, not
 * `limit` of them.
 */
export async function pageOf(
  candidates: Iterator<[string, Pick<IndexedJob, "bytes">]>,
  read: (id: string) => Promise<JobRecord | null>,
  limit: number,
  budget: number,
): Promise<ListJobsReply> {
  const page: JobRecord[] = [];
  let bytes = 0;
  let peeked: [string, Pick<IndexedJob, "bytes">] | undefined;
  const peek = () => {
    if (!peeked) {
      const next = candidates.next();
      peeked = next.done ? undefined : next.value;
    }
    return peeked;
  };
  const withNext = (): ListJobsReply => {
    const last = page[page.length - 1];
    return last ? { jobs: page, next: last.id } : { jobs: page };
  };
  for (;;) {
    // The candidates the page can still hold, by the sizes the index has.
    const batch: string[] = [];
    let planned = bytes;
    for (let c = peek(); c && page.length + batch.length < limit && batch.length < READ_BATCH; c = peek()) {
      if (page.length + batch.length > 0 && planned + c[1].bytes > budget) break;
      batch.push(c[0]);
      planned += c[1].bytes;
      peeked = undefined;
    }
    if (batch.length === 0) break;
    for (const job of await Promise.all(batch.map(read))) {
      if (!job) continue;
      // A record bigger than the index had it (it changed since): the page ends before it, and
      // it is the one that says there is more.
      const size = Buffer.byteLength(JSON.stringify(job));
      if (page.length === limit || (page.length > 0 && bytes + size > budget)) return withNext();
      page.push(job);
      bytes += size;
    }
  }
  // The page is full, or no candidate is left: a next page only if one more is still there.
  for (let c = peek(); c; c = peek()) {
    peeked = undefined;
    if (await read(c[0])) return withNext();
  }
  return { jobs: page };
}
