/**
 * What every view shares: `html` (htm bound to Preact: templates without a JSX build step, and
 * no eval, so the page runs under a CSP without 'unsafe-eval'), state badges, times, and a hook
 * that reloads a view when events say it changed.
 */

import htm from "htm";
import { h } from "preact";
import { useEffect, useRef, useState } from "preact/hooks";
import type { Api } from "./api.js";

export const html = htm.bind(h);

/** A state as a coloured badge: the class is the state's name (`succeeded`, `dead`, …). */
export function Badge({ state }: { state: string }) {
  return html`<span class=${`badge state-${state}`} data-state=${state}>${state}</span>`;
}

/** `2026-11-25T20:31:02.123Z` as the local date and time, `2026-11-25 21:31:02`; "" for none. */
export function when(iso: string | undefined): string {
  if (!iso) return "";
  const t = new Date(iso);
  if (Number.isNaN(t.getTime())) return iso;
  const two = (n: number) => String(n).padStart(2, "0");
  return `${t.getFullYear()}-${two(t.getMonth() + 1)}-${two(t.getDate())} ${two(t.getHours())}:${two(t.getMinutes())}:${two(t.getSeconds())}`;
}

/** A time as `when` writes it, with the full ISO time (UTC) as its tooltip. */
export function At({ iso }: { iso: string | undefined }) {
  return iso ? html`<time datetime=${iso} title=${iso}>${when(iso)}</time>` : null;
}

/** A length of time as `850 ms`, `12.3 s`, `4 min 2 s` or `3 h 12 min`. */
export function millis(ms: number): string {
  if (!Number.isFinite(ms)) return "";
  if (ms < 1000) return `${Math.max(0, Math.round(ms))} ms`;
  if (ms < 60_000) return `${(ms / 1000).toFixed(1)} s`;
  if (ms < 3_600_000) return `${Math.floor(ms / 60_000)} min ${Math.floor((ms % 60_000) / 1000)} s`;
  return `${Math.floor(ms / 3_600_000)} h ${Math.floor((ms % 3_600_000) / 60_000)} min`;
}

/** The time now, again every `everyMs` while `ticking` (a running job's duration, say); else fixed. */
export function useNow(ticking: boolean, everyMs = 1000): number {
  const [now, setNow] = useState(Date.now());
  useEffect(() => {
    if (!ticking) return;
    setNow(Date.now());
    const timer = setInterval(() => setNow(Date.now()), everyMs);
    return () => clearInterval(timer);
  }, [ticking, everyMs]);
  return ticking ? now : Date.now();
}

/** How long from `from` to `to`, or, while `live` and not ended, to now: a duration that ticks each second. */
export function Took({ from, to, live }: { from: string | undefined; to?: string | undefined; live: boolean }) {
  const ticking = live && !!from && !to;
  const now = useNow(ticking);
  if (!from) return null;
  const ms = (to ? Date.parse(to) : now) - Date.parse(from);
  return html`<span data-took data-live=${ticking ? "1" : undefined}>${millis(ms)}</span>`;
}

export interface LiveOptions {
  /** A message on any of these means the view changed. */
  readonly subjects: readonly string[];
  /** What `load` depends on: a change loads again at once. */
  readonly deps: readonly unknown[];
  /** At most one load per this many ms (default 300). */
  readonly quietMs?: number;
  /** Also load every this many ms, for what no event tells of. */
  readonly everyMs?: number;
}

/**
 * Loads with `load` and loads again (at most every `quietMs`) whenever a message arrives on one
 * of `subjects`, so a view follows the system live without reading anything it does not show.
 * Returns the latest value, the latest error, and a function to load now.
 */
export function useLive<T>(
  api: Api,
  load: () => Promise<T>,
  { subjects, deps, quietMs = 300, everyMs }: LiveOptions,
): { value: T | undefined; error: Error | undefined; reload: () => void } {
  const [value, setValue] = useState<T | undefined>(undefined);
  const [error, setError] = useState<Error | undefined>(undefined);
  const generation = useRef(0);
  const reloadRef = useRef<() => void>(() => {});
  useEffect(() => {
    const mine = ++generation.current;
    let timer: ReturnType<typeof setTimeout> | undefined;
    let running = false;
    let again = false;
    const run = async () => {
      if (running) {
        again = true;
        return;
      }
      running = true;
      try {
        const v = await load();
        if (generation.current === mine) {
          setValue(v);
          setError(undefined);
        }
      } catch (err) {
        if (generation.current === mine) setError(err as Error);
      } finally {
        running = false;
        if (again && generation.current === mine) {
          again = false;
          schedule();
        }
      }
    };
    const schedule = () => {
      if (timer === undefined) {
        timer = setTimeout(() => {
          timer = undefined;
          void run();
        }, quietMs);
      }
    };
    reloadRef.current = () => void run();
    // A hidden tab loads nothing; it loads once when shown again, if something changed meanwhile.
    let missed = false;
    const changed = () => {
      if (document.hidden) missed = true;
      else schedule();
    };
    const shown = () => {
      if (!document.hidden && missed) {
        missed = false;
        schedule();
      }
    };
    document.addEventListener("visibilitychange", shown);
    // Progress changes no list: a busy agent's progress lines would reload it for nothing.
    const stops = subjects.map((subject) => api.followBytes(subject, (_data, on) => on.endsWith(".progress") || changed()));
    const poll = everyMs ? setInterval(changed, everyMs) : undefined;
    void run();
    return () => {
      generation.current++;
      document.removeEventListener("visibilitychange", shown);
      if (timer !== undefined) clearTimeout(timer);
      if (poll !== undefined) clearInterval(poll);
      for (const stop of stops) stop();
    };
  }, deps);
  return { value, error, reload: () => reloadRef.current() };
}

/** An error from the API or NATS, shown where its view would be. */
export function Failure({ error }: { error: Error | undefined }) {
  if (!error) return null;
  const code = (error as { code?: string }).code;
  return html`<p class="error" role="alert">${code ? `${code}: ` : ""}${error.message}</p>`;
}

/** The subject of job events the page's principal may follow: all of them, or a submitter's own. */
export function jobEventsSubject(api: Api, kind: "job" | "workflow" = "job"): string {
  const { role, user } = api.session;
  return role === "submitter" ? api.names.subjects.ownerEventsOf(kind, user) : `${api.names.prefix}.evt.${kind}.>`;
}
