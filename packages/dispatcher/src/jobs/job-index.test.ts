import type { JobRecord, JobState } from "@boxcar/protocol";
import { expect, test } from "vitest";
import { decodeImage, encodeImage } from "./index-image.js";
import { JobIndex } from "./job-index.js";

const job = (id: string, state: JobState = "queued", agent = "a") => ({ id, state, agent, pool: "p", owner: "alice" }) as JobRecord;
const ids = (index: JobIndex, after?: string) => [...index.newestFirst(after)].map(([id]) => id);

test("jobs come newest first, each once, however their records arrive and change", () => {
  const index = new JobIndex();
  // A replay in store order, not id order; then the same jobs again as they change.
  for (const id of ["j05", "j01", "j09", "j03", "j07"]) index.observe(id, job(id));
  index.observe("j03", job("j03", "running"));
  index.observe("j09", job("j09", "succeeded"));
  expect(ids(index)).toEqual(["j09", "j07", "j05", "j03", "j01"]);
  expect(ids(index, "j07")).toEqual(["j05", "j03", "j01"]);
  expect(ids(index, "j06")).toEqual(["j05", "j03", "j01"]);
  expect(ids(index, "j01")).toEqual([]);
  const running = job("j03", "running");
  expect([...index.newestFirst()].find(([id]) => id === "j03")?.[1]).toEqual({
    state: "running",
    agent: "a",
    pool: "p",
    owner: "alice",
    bytes: Buffer.byteLength(JSON.stringify(running)), // measured, when the watch does not say
    artifacts: 0,
    endedAt: Number.NaN, // not ended
  });

  // New jobs: at the end, or a little before it (another dispatcher's clock).
  index.observe("j10", job("j10"));
  index.observe("j08", job("j08"));
  expect(ids(index)).toEqual(["j10", "j09", "j08", "j07", "j05", "j03", "j01"]);

  // Deleted jobs leave the list; one made again with the same id comes once.
  index.observe("j05", undefined);
  index.observe("j09", undefined);
  index.observe("j09", job("j09"));
  expect(ids(index)).toEqual(["j10", "j09", "j08", "j07", "j03", "j01"]);
  expect(index.size).toBe(6);
  expect([index.count("queued"), index.count("running"), index.count("succeeded")]).toEqual([5, 1, 0]);
});

test("a walk under way keeps its order while jobs are added and removed", () => {
  const index = new JobIndex();
  for (let i = 10; i < 30; i++) index.observe(`j${i}`, job(`j${i}`));
  const walk = index.newestFirst();
  const seen = [walk.next().value?.[0], walk.next().value?.[0]];
  index.observe("j31", job("j31")); // after the walk's start: not in it
  index.observe("j25", undefined); // removed: skipped
  index.observe("j20x", job("j20x")); // out of order: a new array, the walk keeps its own
  for (let next = walk.next(); !next.done; next = walk.next()) seen.push(next.value[0]);
  const expected = Array.from({ length: 20 }, (_, i) => `j${29 - i}`).filter((id) => id !== "j25");
  expect(seen).toEqual(expected);
});

test("ids that arrive out of order, past several merges, come newest first and oldest first, each once; a walk under way keeps its order", () => {
  const index = new JobIndex();
  const id = (i: number) => `j${String(i).padStart(6, "0")}`;
  const ended = (i: number) => ({ ...job(id(i), "succeeded"), finishedAt: "2026-11-29T00:00:00.000Z" }) as JobRecord;
  for (let i = 0; i < 20_000; i += 2) index.observe(id(i), ended(i));
  const walk = index.newestFirst(); // sorts the replay once
  const seen = [walk.next().value?.[0]];
  // The odd ones, each before the last: 10 000 go among the others, 4 096 at a time merged in.
  for (let i = 19_999; i > 0; i -= 2) index.observe(id(i), ended(i));
  for (let next = walk.next(); !next.done; next = walk.next()) seen.push(next.value[0]);
  expect(seen).toEqual(Array.from({ length: 10_000 }, (_, k) => id(19_998 - 2 * k)));
  const all = Array.from({ length: 20_000 }, (_, k) => id(k));
  expect([...index.newestFirst()].map(([i]) => i)).toEqual([...all].reverse());
  expect([...index.ended()].map(([i]) => i)).toEqual(all);
  expect([...index.newestFirst(id(10_001))].map(([i]) => i)).toEqual(all.slice(0, 10_001).reverse());
});

test("many deletions are compacted away", () => {
  const index = new JobIndex();
  for (let i = 0; i < 5_000; i++) index.observe(`j${String(i).padStart(5, "0")}`, job(`j${i}`));
  for (let i = 0; i < 4_000; i++) index.observe(`j${String(i).padStart(5, "0")}`, undefined);
  expect(index.size).toBe(1_000);
  expect(ids(index)).toHaveLength(1_000);
  expect(ids(index)[0]).toBe("j04999");
});

test("counts by state follow every change, for the owners a caller sees and one agent", () => {
  const index = new JobIndex();
  const of = (id: string, state: JobState, agent: string, owner: string) => ({ id, state, agent, owner }) as JobRecord;
  index.observe("j1", of("j1", "queued", "a", "alice"));
  index.observe("j2", of("j2", "queued", "b", "alice"));
  index.observe("j3", of("j3", "queued", "a", "bob"));
  index.observe("j1", of("j1", "running", "a", "alice"));
  index.observe("j1", of("j1", "succeeded", "a", "alice"));
  index.observe("j2", undefined);
  const nonZero = (counts: Record<string, number>) => Object.fromEntries(Object.entries(counts).filter(([, n]) => n > 0));
  expect(nonZero(index.counts(() => true))).toEqual({ queued: 1, succeeded: 1 });
  expect(nonZero(index.counts((owner) => owner === "alice"))).toEqual({ succeeded: 1 });
  expect(nonZero(index.counts(() => true, "b"))).toEqual({});
  expect(nonZero(index.counts((owner) => owner === "bob", "a"))).toEqual({ queued: 1 });
  // Every state is there, counted or not.
  expect(Object.keys(index.counts(() => false)).length).toBeGreaterThan(8);
});

test("the index keeps each record's size as the watch gives it, so a list knows what a page can hold", () => {
  const index = new JobIndex();
  index.observe("j1", job("j1"), 200_000);
  index.observe("j2", job("j2"), 150);
  index.observe("j1", job("j1", "running"), 200_100);
  expect([...index.newestFirst()].map(([id, indexed]) => [id, indexed.bytes])).toEqual([
    ["j2", 150],
    ["j1", 200_100],
  ]);
});

test("a walk yields only the jobs its filter matches: by state, agent, pool and the owners a caller sees", () => {
  const index = new JobIndex();
  const of = (id: string, state: JobState, agent: string, pool: string, owner: string) => ({ id, state, agent, pool, owner }) as JobRecord;
  index.observe("j1", of("j1", "failed", "a", "gpu", "alice"));
  index.observe("j2", of("j2", "failed", "b", "cpu", "bob"));
  index.observe("j3", of("j3", "queued", "a", "cpu", "alice"));
  index.observe("j4", of("j4", "failed", "a", "cpu", "bob"));
  const walk = (filter: Parameters<JobIndex["newestFirst"]>[1], after?: string) => [...index.newestFirst(after, filter)].map(([id]) => id);
  expect(walk({ state: "failed" })).toEqual(["j4", "j2", "j1"]);
  expect(walk({ state: "failed", agent: "a" })).toEqual(["j4", "j1"]);
  expect(walk({ pool: "cpu", owner: (owner) => owner === "alice" })).toEqual(["j3"]);
  expect(walk({ state: "failed" }, "j4")).toEqual(["j2", "j1"]);
  expect(walk({ agent: "nobody" })).toEqual([]); // a name no job has
  expect(walk({ pool: "gpu" })).toEqual(["j1"]);
  // The owner predicate is asked once per owner, not once per job.
  const asked: string[] = [];
  walk({
    owner: (owner) => {
      asked.push(owner);
      return true;
    },
  });
  expect(asked.sort()).toEqual(["alice", "bob"]);
});

test("names shared by many jobs are kept once, and a name no job has any more is forgotten and its number given to another", () => {
  const index = new JobIndex();
  const of = (id: string, agent: string, owner: string) => ({ id, state: "queued", agent, pool: "p", owner }) as JobRecord;
  for (let i = 0; i < 100; i++) index.observe(`a${i}`, of(`a${i}`, "old-agent", "carol"));
  expect([...index.newestFirst(undefined, { agent: "old-agent" })]).toHaveLength(100);
  for (let i = 0; i < 100; i++) index.observe(`a${i}`, of(`a${i}`, "new-agent", "carol")); // the agent renamed
  expect([...index.newestFirst(undefined, { agent: "old-agent" })]).toHaveLength(0);
  index.observe("b1", of("b1", "third", "dave")); // takes the number old-agent had
  expect([...index.newestFirst(undefined, { agent: "new-agent" })]).toHaveLength(100);
  expect([...index.newestFirst(undefined, { agent: "third" })].map(([id, j]) => [id, j.agent, j.owner])).toEqual([["b1", "third", "dave"]]);
  expect(index.counts((owner) => owner === "dave").queued).toBe(1);
});

test("deleted jobs' entries are used again by new jobs once compacted, and a job made again keeps its place", () => {
  const index = new JobIndex();
  const id = (i: number) => `j${String(i).padStart(5, "0")}`;
  for (let i = 0; i < 4_000; i++) index.observe(id(i), job(id(i), "succeeded"));
  for (let i = 0; i < 2_000; i++) index.observe(id(i), undefined); // compacted on the way
  expect(index.size).toBe(2_000);
  expect(index.has(id(0))).toBe(false);
  for (let i = 4_000; i < 6_000; i++) index.observe(id(i), job(id(i), "running")); // in the freed entries
  index.observe(id(2_500), undefined);
  index.observe(id(2_500), job(id(2_500), "queued")); // deleted and made again before a compaction
  expect(index.size).toBe(4_000);
  const all = [...index.newestFirst()];
  expect(all).toHaveLength(4_000);
  expect(all[0]?.[0]).toBe(id(5_999));
  expect(all.at(-1)?.[0]).toBe(id(2_000));
  expect(all.find(([i]) => i === id(2_500))?.[1].state).toBe("queued");
  expect(all.find(([i]) => i === id(4_000))?.[1].state).toBe("running");
  expect([index.count("succeeded"), index.count("running"), index.count("queued")]).toEqual([1_999, 2_000, 1]);
});

test("a walk begun before a compaction never yields a deleted job, nor another job's entry under its id", () => {
  const index = new JobIndex();
  const id = (i: number) => `j${String(i).padStart(5, "0")}`;
  for (let i = 0; i < 4_000; i++) index.observe(id(i), job(id(i), "succeeded"));
  const walk = index.newestFirst();
  const seen = [walk.next().value];
  for (let i = 0; i < 2_000; i++) index.observe(id(i), undefined); // compacted on the way
  for (let i = 4_000; i < 6_000; i++) index.observe(id(i), job(id(i), "running")); // in the freed entries
  for (let next = walk.next(); !next.done; next = walk.next()) seen.push(next.value);
  expect(seen.map((s) => s?.[0])).toEqual(Array.from({ length: 2_000 }, (_, i) => id(3_999 - i)));
  expect(new Set(seen.map((s) => s?.[1].state))).toEqual(new Set(["succeeded"]));
});

test("a filter no job matches, by the counts, walks nothing; one that matches a few finds them however old", () => {
  const index = new JobIndex();
  const id = (i: number) => `j${String(i).padStart(6, "0")}`;
  for (let i = 0; i < 100_000; i++) index.observe(id(i), job(id(i), i % 1_000 === 0 ? "failed" : "succeeded", `agent${i % 10}`));
  expect([...index.newestFirst(undefined, { state: "running" })]).toEqual([]);
  expect([...index.newestFirst(undefined, { state: "failed", agent: "agent1" })]).toEqual([]);
  expect([...index.newestFirst(undefined, { state: "failed", owner: (o) => o !== "alice" })]).toEqual([]);
  const failed = [...index.newestFirst(undefined, { state: "failed", agent: "agent0" })].map(([i]) => i);
  expect(failed).toHaveLength(100);
  expect(failed.at(-1)).toBe(id(0));
  // A pool is not counted: the walk decides.
  expect([...index.newestFirst(undefined, { state: "failed", pool: "p" })]).toHaveLength(100);
  expect([...index.newestFirst(undefined, { state: "running", pool: "p" })]).toEqual([]);
});

test("ended jobs come oldest first with when each ended, and every change is told with what the job was", () => {
  const index = new JobIndex();
  const changes: [string, string | undefined, string | undefined][] = [];
  index.onChange((id, before, after) => changes.push([id, before?.state, after?.state]));
  const at = "2026-01-01T00:00:00.000Z";
  const of = (id: string, state: JobState, finishedAt?: string) =>
    ({ id, state, agent: "a", pool: "p", owner: "o", createdAt: at, finishedAt, artifacts: [{ size: 5 }, { size: 7 }] }) as JobRecord;
  index.observe("j2", of("j2", "succeeded", "2026-01-02T00:00:00.000Z"));
  index.observe("j1", of("j1", "cancelled")); // no finishedAt: its creation
  index.observe("j3", of("j3", "running"));
  index.observe("j3", of("j3", "failed", "2026-01-03T00:00:00.000Z"));
  index.observe("j2", undefined);
  expect([...index.ended()].map(([id, j]) => [id, j.state, new Date(j.endedAt).toISOString(), j.artifacts])).toEqual([
    ["j1", "cancelled", at, 12],
    ["j3", "failed", "2026-01-03T00:00:00.000Z", 12],
  ]);
  expect([index.isEnded("j1"), index.isEnded("j2"), index.isEnded("nope")]).toEqual([true, false, false]);
  expect(changes).toEqual([
    ["j2", undefined, "succeeded"],
    ["j1", undefined, "cancelled"],
    ["j3", undefined, "running"],
    ["j3", "running", "failed"],
    ["j2", "succeeded", undefined],
  ]);
});

test("an image, written as bytes and read back into a new index, gives it every settled job as it was, and names the rest", () => {
  const index = new JobIndex();
  const at = "2026-11-29T00:00:00.000Z";
  const ended = (id: string, state: JobState, agent: string, owner: string, extra: Partial<JobRecord> = {}) =>
    ({ id, state, agent, pool: "p", owner, createdAt: at, finishedAt: at, ...extra }) as JobRecord;
  for (let i = 0; i < 300; i++)
    index.observe(`s${String(i).padStart(3, "0")}`, ended("", i % 3 ? "succeeded" : "failed", `a${i % 4}`, `u${i % 5}`), 100 + i);
  index.observe("q1", job("q1", "queued"));
  index.observe("r1", job("r1", "running"));
  // Ended, with something still to do: a handoff not yet decided, a provider pause still to come.
  index.observe(
    "h1",
    ended("h1", "succeeded", "a0", "u0", {
      result: {
        exitCode: 0,
        signal: null,
        output: null,
        durationMs: 1,
        handoff: { to: "b", input: null, carryFiles: false, stayInSession: false },
      },
    }),
  );
  index.observe("p1", ended("p1", "failed", "a0", "u0", { providerLimitedUntil: new Date(Date.now() + 60_000).toISOString() }));
  index.observe("s000", undefined); // deleted: in neither list
  const { meta, image } = decodeImage(encodeImage(index.image(), { seq: 42 }));
  expect(meta).toEqual({ seq: 42 });
  expect(image.unsettled.sort()).toEqual(["h1", "p1", "q1", "r1"]);
  expect(image.ids).toHaveLength(299);

  const restored = new JobIndex();
  const changes: string[] = [];
  restored.onChange((id, before, after) => changes.push(`${id} ${before?.state} ${after?.state}`));
  restored.restore(image);
  expect(changes).toHaveLength(299); // the quotas' counts follow
  const settled = (i: JobIndex) => [...i.newestFirst()].filter(([id]) => id.startsWith("s"));
  expect(settled(restored)).toEqual(settled(index));
  const everyone = () => true;
  const counts = index.counts(everyone);
  counts.queued -= 1;
  counts.running -= 1;
  counts.succeeded -= 1;
  counts.failed -= 1;
  expect(restored.counts(everyone)).toEqual(counts);
  expect([...restored.newestFirst(undefined, { agent: "a2", owner: (o) => o === "u3" })]).toEqual([
    ...index.newestFirst(undefined, { agent: "a2", owner: (o) => o === "u3" }),
  ]);
});

test("bytes that are not an image are refused, naming what is wrong", () => {
  const index = new JobIndex();
  index.observe("j1", { ...job("j1", "succeeded"), createdAt: "2026-11-29T00:00:00.000Z" } as JobRecord);
  const bytes = Buffer.from(encodeImage(index.image(), {}));
  expect(() => decodeImage(Buffer.from("hello there"))).toThrow(/does not begin with BXIX/);
  expect(() => decodeImage(bytes.subarray(0, bytes.length - 1))).toThrow(/bytes, its header says/);
  const badState = Buffer.from(bytes);
  badState[9 + badState.readUInt32LE(5)] = 200; // the first job's state
  expect(() => decodeImage(badState)).toThrow(/job j1 has no state numbered 200/);
  badState[9 + badState.readUInt32LE(5)] = 1; // queued: not ended, so not settled
  expect(() => decodeImage(badState)).toThrow(/job j1 is queued, not ended/);
  const badSize = Buffer.from(bytes);
  badSize.writeDoubleLE(Number.NaN, 9 + badSize.readUInt32LE(5) + 1 + 12); // its record's size
  expect(() => decodeImage(badSize)).toThrow(/job j1's sizes are not sizes/);
  const badId = Buffer.from(bytes);
  badId.write("*", badId.length - 2); // a wildcard in its id
  expect(() => decodeImage(badId)).toThrow(/is not a job id/);
  const badName = Buffer.from(bytes);
  badName.writeUInt32LE(7, 9 + badName.readUInt32LE(5) + 1); // its agent
  expect(() => decodeImage(badName)).toThrow(/job j1 names name 7 of/);
  expect(() => decodeImage(Buffer.concat([bytes.subarray(0, 4), Buffer.of(9), bytes.subarray(5)]))).toThrow(/version is 9/);
});
