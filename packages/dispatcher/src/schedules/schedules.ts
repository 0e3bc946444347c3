import type { Logger } from "@boxcar/common";
import type { Topology } from "@boxcar/fabric";
import { isRevisionConflict, nowIso } from "@boxcar/fabric/internal";
import {
  BoxcarError,
  ErrorCode,
  type ErrorInfo,
  type Identity,
  isTerminal,
  type JobRecord,
  ownerOf,
  PROTOCOL_VERSION,
  Role,
  type ScheduleDefinition,
  ScheduleRecord,
  type ScheduleState,
  toErrorInfo,
} from "@boxcar/protocol";
import { mayAccess, seesAll } from "@boxcar/protocol/internal";
import type { KV } from "@nats-io/kv";
import { Cron } from "croner";
import { type AdmissionContext, admitContinued, recordRejection } from "../intake/admission.js";
import { KeyTimers, MAX_TIMER_MS } from "../loops/key-timers.js";
import { PassPerKey } from "../loops/pass-per-key.js";
import { Sweep } from "../loops/sweep.js";

/** A tick evaluated later than this (or than half its period, if shorter) after its time was missed. */
const ON_TIME_MS = 10_000;
/** The most missed ticks `all` fires at once. */
const MAX_CATCH_UP = 1_000;
/** How old a claim of a tick whose job is not yet noted must be before another dispatcher admits it. */
const REDRIVE_AFTER_MS = 1_000;
/** Refusals every later tick would meet too: the schedule pauses (its owner mends it and resumes it). */
const RECURRING: readonly string[] = [ErrorCode.unknownAgent, ErrorCode.policyDenied, ErrorCode.forbidden, ErrorCode.invalid];
/** Errors after which a tick's job is tried again at the next look, not refused. */
const TRANSIENT: readonly string[] = [ErrorCode.unavailable, ErrorCode.storageFull, ErrorCode.queueFull, ErrorCode.internal];

/**
 * Schedules (docs/flow-control.md#schedules): each schedule submits its job at each tick of its
 * cron expression, in its time zone, as its owner. Every dispatcher watches the schedules bucket
 * and sets a timer for each schedule's next tick; at a tick they all look, and the one whose
 * compare-and-swap of the schedule's state claims the tick (its `tick` moves past it) acts on
 * it: fires (the job is admitted with an idempotency key of the schedule and the tick, so even an
 * admission a dispatcher dies in is finished by the next look and never doubled), skips or queues
 * it (its overlap policy, while the last tick's job has not ended), or counts it missed (its
 * catch-up policy, for ticks nobody looked at in time: all dispatchers were down). A sweep looks
 * at every schedule every 15 s besides (`schedulesIntervalMs`), and a job of a schedule that
 * ends makes the dispatchers look at it (a tick queued behind it fires then).
 */
export class Schedules {
  /** Each schedule's next look: at its next tick, or a day on at the latest (it is looked at again then). */
  private readonly timers = new KeyTimers({ unref: true });
  /** Looks at a schedule, one look at a time per schedule (a call during a look makes one more). */
  private readonly looks = new PassPerKey(
    (key) => this.lookOnce(key),
    (err, key) => this.log.warn({ err, schedule: key }, "could not look at a schedule"),
  );
  private readonly sweeps: Sweep;
  private stopWatch: (() => void) | undefined;
  /** Job records are looked at once it has started (the sweep sees to the ends before). */
  private started = false;
  private closed = false;

  /** The schedules bucket, once it exists: made by the first schedule, so a system with none has none. */
  private opened: Promise<KV | undefined> | undefined;

  /** Looks at every schedule every `intervalMs` once started. */
  constructor(
    private readonly topology: Topology,
    private readonly ctx: AdmissionContext,
    private readonly log: Logger,
    intervalMs: number,
  ) {
    this.sweeps = new Sweep({
      pass: () => this.sweep(),
      intervalMs,
      onError: (err) => log.warn({ err }, "could not sweep the schedules"),
    });
  }

  /** Sets the sweep's timer, and opens and watches the schedules bucket if there is one. */
  async start(): Promise<void> {
    this.sweeps.start();
    await this.store(false);
    this.started = true;
  }

  /**
   * The schedules bucket, made when `make` (a schedule is created) or opened if it exists; the
   * first time, this dispatcher starts watching it. Undefined while no schedule was ever made.
   */
  private store(make: boolean): Promise<KV | undefined> {
    const open = async (): Promise<KV | undefined> => {
      const { topology } = this;
      if (!make) {
        const exists = await topology.jsm.streams.info(`KV_${topology.names.buckets.schedules}`).then(
          () => true,
          () => false,
        );
        if (!exists) return undefined;
      }
      const bucket = await topology.schedules();
      const watch = await bucket.watch();
      this.stopWatch = () => watch.stop();
      void (async () => {
        for await (const entry of watch) this.look(entry.key);
      })();
      return bucket;
    };
    this.opened = (this.opened ?? Promise.resolve(undefined)).then((bucket) => bucket ?? open());
    const opened = this.opened;
    // A failure to open is tried again next time.
    opened.catch(() => {
      if (this.opened === opened) this.opened = undefined;
    });
    return opened;
  }

  /** The bucket, which exists once a schedule does (a look or a change is about one). */
  private async bucket(): Promise<KV> {
    const bucket = await this.store(false);
    if (!bucket) throw new BoxcarError(ErrorCode.notFound, "no schedule was ever made");
    return bucket;
  }

  // The API.

  async create(definition: ScheduleDefinition, caller: Identity): Promise<ScheduleRecord> {
    cronOf(definition, "definition.");
    await this.ctx.agents.get(definition.job.agent);
    const record: ScheduleRecord = {
      v: PROTOCOL_VERSION,
      definition,
      owner: caller.user,
      role: caller.role,
      createdAt: nowIso(),
      paused: false,
      state: { fired: 0, skipped: 0, missed: 0 },
    };
    try {
      await ((await this.store(true)) as KV).create(keyOf(caller.user, definition.name), JSON.stringify(record));
    } catch (err) {
      if (!isRevisionConflict(err)) throw err;
      throw new BoxcarError(ErrorCode.conflict, `schedule ${definition.name} exists: delete it first, or give another name`);
    }
    return withNext(record);
  }

  /**
   * Replaces the definition of the caller's schedule of that name, keeping its history (counts,
   * last tick) and its ticks' keys. Like a resume, it catches up no tick from before the change
   * (not one queued under the old definition either); a tick being fired as it changes fires
   * with the definition it was claimed under.
   */
  async update(definition: ScheduleDefinition, caller: Identity): Promise<ScheduleRecord> {
    cronOf(definition, "definition.");
    await this.ctx.agents.get(definition.job.agent);
    for (;;) {
      const { key, record, revision } = await this.read({ name: definition.name }, caller);
      const { pending: _queued, ...state } = record.state;
      const next: ScheduleRecord = { ...record, definition, resumedAt: nowIso(), state };
      try {
        await (await this.bucket()).update(key, JSON.stringify(next), revision);
        return withNext(next);
      } catch (err) {
        if (!isRevisionConflict(err)) throw err; // changed meanwhile (a tick): read it again
      }
    }
  }

  async get(ref: { name: string; owner?: string | undefined }, caller: Identity): Promise<ScheduleRecord> {
    return withNext((await this.read(ref, caller)).record);
  }

  async list(caller: Identity): Promise<ScheduleRecord[]> {
    const filter = seesAll(caller.role) ? ">" : `${caller.user}.>`;
    const bucket = await this.store(false);
    if (!bucket) return [];
    const keys: string[] = [];
    for await (const key of await bucket.keys(filter)) keys.push(key);
    const records: ScheduleRecord[] = [];
    for (const key of keys.sort()) {
      const found = await this.entry(key);
      if (found) records.push(withNext(found.record));
    }
    return records;
  }

  /** Pauses or resumes a schedule; a resumed one catches up no tick from before it was resumed. */
  async setPaused(ref: { name: string; owner?: string | undefined }, caller: Identity, paused: boolean): Promise<ScheduleRecord> {
    for (;;) {
      const { key, record, revision } = await this.read(ref, caller);
      if (record.paused === paused) return withNext(record);
      // A resumed schedule catches up nothing from before: not a tick queued or claimed then either.
      const { pending: _queued, firing: _claimed, ...state } = record.state;
      const next: ScheduleRecord = paused ? { ...record, paused } : { ...record, paused, resumedAt: nowIso(), state };
      try {
        await (await this.bucket()).update(key, JSON.stringify(next), revision);
        return withNext(next);
      } catch (err) {
        if (!isRevisionConflict(err)) throw err;
      }
    }
  }

  async remove(ref: { name: string; owner?: string | undefined }, caller: Identity): Promise<ScheduleRecord> {
    for (;;) {
      const { key, record, revision } = await this.read(ref, caller);
      try {
        await (await this.bucket()).delete(key, { previousSeq: revision });
        return record;
      } catch (err) {
        if (!isRevisionConflict(err)) throw err; // changed meanwhile (a tick): read it again
      }
    }
  }

  private async read(ref: { name: string; owner?: string | undefined }, caller: Identity) {
    const owner = ref.owner ?? caller.user;
    const key = keyOf(owner, ref.name);
    const found = mayAccess(caller, owner) ? await this.entry(key) : undefined;
    if (!found) throw new BoxcarError(ErrorCode.notFound, `no schedule ${ref.name}${ref.owner ? ` of ${ref.owner}` : ""}`);
    return { key, ...found };
  }

  private async entry(key: string): Promise<{ record: ScheduleRecord; revision: number; writtenAt: number } | undefined> {
    const bucket = await this.store(false);
    const entry = bucket ? await bucket.get(key) : undefined;
    if (entry?.operation !== "PUT") return undefined;
    const parsed = ScheduleRecord.safeParse(entry.json());
    if (!parsed.success) {
      this.log.warn({ key }, "a schedule does not parse; leaving it alone");
      return undefined;
    }
    return { record: parsed.data, revision: entry.revision, writtenAt: entry.created.getTime() };
  }

  // Firing.

  /** Shown each job record by the dispatcher's watch: a schedule's job that ends may let a queued tick fire. */
  readonly observe = (_key: string, job: JobRecord | undefined): void => {
    if (this.started && job?.schedule && isTerminal(job.state)) this.look(keyOf(ownerOf(job), job.schedule.name));
  };

  /** Looks at every schedule (a timer lost, a tick whose admission failed for now). */
  private async sweep(): Promise<void> {
    const bucket = await this.store(false);
    if (!bucket) return;
    for await (const key of await bucket.keys()) this.look(key);
  }

  private look(key: string): void {
    void this.looks.run(key);
  }

  private async lookOnce(key: string): Promise<void> {
    this.timers.clear(key);
    // Looked at again at its next tick, or sooner: a claim to finish, a look that failed.
    let again: number | undefined;
    try {
      for (let tries = 0; tries < 20; tries++) {
        const found = await this.entry(key);
        if (!found || found.record.paused) return;
        // A tick claimed by a dispatcher that died (or is slow) before its job was noted: admitted
        // again (the same job, by its key) once the claim is a second old.
        const { firing } = found.record.state;
        if (firing) {
          if (Date.now() - found.writtenAt <= REDRIVE_AFTER_MS) {
            again = REDRIVE_AFTER_MS + 100;
            break;
          }
          await this.fire(key, found.record, firing);
          continue;
        }
        const step = await this.decide(found.record);
        if (!step) break;
        try {
          await (await this.bucket()).update(key, JSON.stringify({ ...found.record, state: step.state }), found.revision);
        } catch (err) {
          if (isRevisionConflict(err)) continue; // another dispatcher moved it: look again
          throw err;
        }
        if (step.admit) await this.fire(key, { ...found.record, state: step.state }, step.admit);
      }
    } catch (err) {
      again = 1_000;
      throw err;
    } finally {
      if (!this.closed) await this.setTimer(key, again);
    }
  }

  /** Sets the schedule's timer: for its next tick, or `inMs` when sooner. */
  private async setTimer(key: string, inMs: number | undefined): Promise<void> {
    const found = await this.entry(key).catch(() => undefined);
    if (!found || found.record.paused) {
      if (inMs === undefined) return;
    }
    const next = found && !found.record.paused ? cronOf(found.record.definition).nextRun(new Date()) : null;
    const toTick = next ? next.getTime() - Date.now() : Number.POSITIVE_INFINITY;
    const wait = Math.min(Math.max(0, toTick), inMs ?? Number.POSITIVE_INFINITY, MAX_TIMER_MS);
    this.timers.set(key, wait, () => this.look(key));
  }

  /**
   * What to do next with a schedule, as a new state to claim by compare-and-swap, and the tick
   * to admit a job for once it is claimed; undefined when there is nothing to do now.
   */
  private async decide(record: ScheduleRecord): Promise<{ state: ScheduleState; admit?: string } | undefined> {
    const { state, definition } = record;
    const now = Date.now();
    const cron = cronOf(definition);
    const from = Math.max(Date.parse(state.tick ?? record.createdAt), Date.parse(record.resumedAt ?? record.createdAt));
    // The ticks since the last one dealt with, oldest first: the latest 1 000 at most.
    const due: Date[] = [];
    for (let t = new Date(now + 1); due.length <= MAX_CATCH_UP; ) {
      const before = cron.previousRuns(1, t)[0];
      if (!before || before.getTime() <= from) break;
      due.unshift(before);
      t = before;
    }
    // More than 1 000 due: the oldest is dropped (missed), and so may be more before it, uncounted.
    let uncounted = 0;
    if (due.length > MAX_CATCH_UP) {
      due.shift();
      uncounted = 1;
    }
    if (due.length === 0 && !state.pending) return undefined;
    const running = state.jobId !== undefined && (await this.runs(state.jobId));
    if (state.pending && !running) {
      const { pending: _fires, ...rest } = state;
      return { state: { ...rest, firing: state.pending }, admit: state.pending };
    }
    const last = due.at(-1);
    if (!last) return undefined;
    const onTime = now - last.getTime() <= Math.min(ON_TIME_MS, periodAfter(cron, last) / 2);
    if (onTime && due.length === 1) return this.onTick(state, last.toISOString(), running, definition.overlap);
    // Ticks were missed: the catch-up policy says which fires (one per look; `all` fires the
    // rest on the looks that follow, oldest first).
    const window = now - definition.catchUpWindow;
    const fire =
      definition.catchUp === "all" ? due.find((t) => t.getTime() >= window) : onTime || definition.catchUp === "last" ? last : undefined;
    const passed = due.filter((t) => t.getTime() < (fire?.getTime() ?? Number.POSITIVE_INFINITY)).length + uncounted;
    if (!fire) return { state: { ...state, tick: last.toISOString(), action: "missed", missed: state.missed + passed } };
    return this.onTick({ ...state, missed: state.missed + passed }, fire.toISOString(), running, definition.overlap);
  }

  /** A tick to act on: fired, or, while the last tick's job runs, skipped, queued or fired beside it (its overlap policy). */
  private onTick(state: ScheduleState, tick: string, running: boolean, overlap: ScheduleDefinition["overlap"]) {
    if (running && overlap === "skip") return { state: { ...state, tick, action: "skipped" as const, skipped: state.skipped + 1 } };
    if (running && overlap === "queue-one") {
      // One waits at most: a later tick while one waits is skipped.
      return state.pending
        ? { state: { ...state, tick, action: "skipped" as const, skipped: state.skipped + 1 } }
        : { state: { ...state, tick, action: "queued" as const, pending: tick } };
    }
    return { state: { ...state, tick, action: "fired" as const, firing: tick }, admit: tick };
  }

  /** Whether the job is still to end (a job not found has ended, as far as overlap goes). */
  private async runs(jobId: string): Promise<boolean> {
    const found = await this.topology.jobStore.read(jobId);
    return !!found && !isTerminal(found.record.state);
  }

  /**
   * Admits the job of a claimed tick, as the schedule's owner, with an idempotency key of the
   * schedule (as created) and the tick: every dispatcher that does it gets the one job. One that
   * cannot be admitted is recorded `rejected` (its owner sees why); one refused for now (no room,
   * say) is tried again at the next look. Then the tick's job is noted.
   */
  private async fire(key: string, record: ScheduleRecord, tick: string): Promise<void> {
    const name = record.definition.name;
    const implicitKey = `schedule:${key}:${record.createdAt}:${tick}`;
    let jobId: string;
    let refused: ErrorInfo | undefined;
    try {
      // Its owner's quota, as for a submit of its own (admins have none).
      const { job } = await admitContinued(this.topology, record.definition.job, this.ctx, {
        owner: record.owner,
        ownerRole: Role.safeParse(record.role).data,
        implicitKey,
        schedule: { name, tick },
      });
      jobId = job.id;
    } catch (err) {
      if (!(err instanceof BoxcarError) || TRANSIENT.includes(err.code)) throw err;
      refused = toErrorInfo(err);
      const rejected = await recordRejection(this.topology, record.definition.job.agent, record.owner, refused, implicitKey, {
        schedule: { name, tick },
      });
      jobId = rejected.id;
      this.log.warn({ schedule: key, tick, err }, "a schedule's job was refused");
    }
    for (let tries = 0; tries < 20; tries++) {
      const found = await this.entry(key);
      if (!found || found.record.state.firing !== tick) return; // noted by another dispatcher
      const { firing: _admitted, lastError: _before, ...state } = found.record.state;
      // A refusal that every tick would meet again (its agent removed, the policy) pauses it.
      const pause = refused !== undefined && RECURRING.includes(refused.code);
      const next = {
        ...found.record,
        ...(pause ? { paused: true } : {}),
        state: { ...state, jobId, jobTick: tick, fired: state.fired + 1, ...(refused ? { lastError: refused } : {}) },
      };
      try {
        await (await this.bucket()).update(key, JSON.stringify(next), found.revision);
        return;
      } catch (err) {
        if (!isRevisionConflict(err)) throw err;
      }
    }
  }

  /** Stops the sweep, the watch and the timers, and waits for the looks under way. */
  async stop(): Promise<void> {
    this.closed = true;
    await this.sweeps.stop();
    this.stopWatch?.();
    this.timers.stop();
    await this.looks.stop();
  }
}

function keyOf(owner: string, name: string): string {
  return `${owner}.${name}`;
}

/** A schedule's cron expression, compiled; a bad one (or a bad time zone) is refused naming the field under `path`. */
function cronOf(definition: ScheduleDefinition, path = ""): Cron {
  const fields = definition.cron.trim().split(/\s+/).length;
  if (!definition.cron.trim().startsWith("@") && fields !== 5 && fields !== 6) {
    throw new BoxcarError(
      ErrorCode.invalid,
      `cron ${JSON.stringify(definition.cron)} has ${fields} fields: give 5, or 6 with seconds first`,
      {
        issues: [{ path: `${path}cron`, message: "5 fields, or 6 with seconds first" }],
      },
    );
  }
  try {
    return new Cron(definition.cron, { timezone: definition.timezone, paused: true });
  } catch (err) {
    throw new BoxcarError(ErrorCode.invalid, `cron ${JSON.stringify(definition.cron)}: ${(err as Error).message}`, {
      issues: [{ path: `${path}cron`, message: (err as Error).message }],
    });
  }
}

/** How long after `tick` the next one comes (a long time for a schedule with none). */
function periodAfter(cron: Cron, tick: Date): number {
  const next = cron.nextRun(tick);
  return next ? next.getTime() - tick.getTime() : Number.POSITIVE_INFINITY;
}

/** A record as the API returns it: with when it fires next, unless it is paused. */
function withNext(record: ScheduleRecord): ScheduleRecord {
  const next = record.paused ? undefined : cronOf(record.definition).nextRun(new Date());
  return next ? { ...record, next: next.toISOString() } : record;
}
