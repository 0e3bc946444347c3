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

/** `2026-11-25T20:31:02.123Z` as the local time of day, or date and time when not today. */
export function when(iso: string | undefined): string {
  if (!iso) return "";
  const t = new Date(iso);
  return t.toDateString() === new Date().toDateString() ? t.toLocaleTimeString() : t.toLocaleString();
}

/** How long from `from` to `to` (or now), as `850 ms`, `12.3 s` or `4 min 2 s`. */
export function duration(from: string | undefined, to?: string): string {
  if (!from) return "";
  const ms = (to ? Date.parse(to) : Date.now()) - Date.parse(from);
  if (ms < 1000) return `${Math.max(0, ms)} ms`;
  if (ms < 60_000) return `${(ms / 1000).toFixed(1)} s`;
  return `${Math.floor(ms / 60_000)} min ${Math.round((ms % 60_000) / 1000)} s`;
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
