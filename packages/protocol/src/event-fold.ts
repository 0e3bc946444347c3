/** Unfolding stored events, with no schema library: the dashboard's page uses it too (`@boxcar/protocol/event-fold`). */

import type { BoxcarEvent } from "./events.js";

/** A stored event as the events it stands for: the ones folded into it, oldest first, then itself. */
export function unfoldEvents(event: BoxcarEvent): BoxcarEvent[] {
  if (event.kind !== "job" || !event.folded) return [event];
  const { folded, ...last } = event;
  return [...folded, last];
}
