/**
 * A message's or entry's body as JSON, for a schema's `safeParse`: undefined (which no schema
 * of Boxcar's accepts) when it is not JSON, so one bad message cannot stop a watch.
 */
export function jsonOf(msg: { json(): unknown }): unknown {
  try {
    return msg.json();
  } catch {
    return undefined;
  }
}
