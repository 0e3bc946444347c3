import { hostname } from "node:os";
import { type Logger, silentLogger } from "@boxcar/common";
import type { Topology, WorkSigner } from "@boxcar/fabric";
import type { Registry } from "prom-client";

export interface DispatcherOptions {
  topology: Topology;
  logger?: Logger;
  /** Identifies this dispatcher in logs and `$SRV.INFO`; default `d-<host>-<random>`. */
  dispatcherId?: string;
  /** Version reported by the services API; default the package's. */
  version?: string;
  /** How often jobs past their queue timeout are looked for (`ExpirySweep`); default 1000 ms. */
  expiryIntervalMs?: number;
  /** How often ended jobs past the system policy's retention are looked for and deleted (`RetentionSweep`); default 60000 ms. */
  retentionIntervalMs?: number;
  /** How often queued jobs without a work item are looked for (`RecoverySweep`); default 60000 ms. */
  recoveryIntervalMs?: number;
  /**
   * How often the work stream is swept for items JetStream gave up on (`GivenUpSweep`); default
   * 15000 ms. It is also the default of `lostSessionIntervalMs`, `concurrencyIntervalMs` and
   * `schedulesIntervalMs`.
   */
  givenUpIntervalMs?: number;
  /** How often the jobs of sessions whose worker is gone are looked for (`LostSessionSweep`); default `givenUpIntervalMs`. */
  lostSessionIntervalMs?: number;
  /** How often the concurrency limits are swept for places left held and jobs left waiting; default `givenUpIntervalMs`. */
  concurrencyIntervalMs?: number;
  /** How often every schedule is looked at besides its own timer; default `givenUpIntervalMs`. */
  schedulesIntervalMs?: number;
  /** How often new jobs are checked for a work item their admission may have left unpublished (`AdmissionSweep`); default 1000 ms. */
  admissionIntervalMs?: number;
  /** How often workers that stopped heartbeating are forgotten; default 60000 ms. */
  goneWorkersIntervalMs?: number;
  /**
   * How often the job index's snapshot, which a dispatcher starts from, is written (by one
   * dispatcher, when jobs changed); default 600000 ms. A jobs bucket's delete marker is removed
   * once a snapshot covers it, at most this and two minutes after it was written.
   */
  indexSnapshotIntervalMs?: number;
  /**
   * Signs every work item (see `WorkSigner`); workers configured with its public key run only
   * items it signed. The CLI makes one from the dispatcher's NATS credential.
   */
  signer?: WorkSigner;
  /**
   * Aborted while it still waits for JetStream at start (a recovering cluster), it gives up
   * waiting and throws the abort; what it had started is stopped.
   */
  signal?: AbortSignal;
  /** A Prometheus registry to put this dispatcher's metrics in (docs/observability.md); absent: none are kept. */
  metrics?: Registry;
}

/** How often each of the dispatcher's sweeps runs, in ms. */
export interface SweepIntervals {
  expiry: number;
  retention: number;
  recovery: number;
  givenUp: number;
  lostSession: number;
  concurrency: number;
  schedules: number;
  admission: number;
  goneWorkers: number;
  indexSnapshot: number;
}

export interface ResolvedDispatcherOptions {
  topology: Topology;
  id: string;
  version: string;
  log: Logger;
  intervals: SweepIntervals;
  signer: WorkSigner | undefined;
  signal: AbortSignal | undefined;
  metrics: Registry | undefined;
}

const VERSION = "0.1.0";

/** The options with every default filled in; the logger is the given one's child for this dispatcher. */
export function resolveDispatcherOptions(opts: DispatcherOptions): ResolvedDispatcherOptions {
  const id = opts.dispatcherId ?? `d-${hostname().replace(/[^A-Za-z0-9_-]/g, "-")}-${Math.random().toString(36).slice(2, 8)}`;
  const givenUp = opts.givenUpIntervalMs ?? 15_000;
  return {
    topology: opts.topology,
    id,
    version: opts.version ?? VERSION,
    log: (opts.logger ?? silentLogger).child({ dispatcherId: id }),
    intervals: {
      expiry: opts.expiryIntervalMs ?? 1_000,
      retention: opts.retentionIntervalMs ?? 60_000,
      recovery: opts.recoveryIntervalMs ?? 60_000,
      givenUp,
      lostSession: opts.lostSessionIntervalMs ?? givenUp,
      concurrency: opts.concurrencyIntervalMs ?? givenUp,
      schedules: opts.schedulesIntervalMs ?? givenUp,
      admission: opts.admissionIntervalMs ?? 1_000,
      goneWorkers: opts.goneWorkersIntervalMs ?? 60_000,
      indexSnapshot: opts.indexSnapshotIntervalMs ?? 600_000,
    },
    signer: opts.signer,
    signal: opts.signal,
    metrics: opts.metrics,
  };
}
