/**
 * The dispatchers' request/reply API as a client calls it (`DispatcherApi`): a request sent as
 * the client's identity, with the caller's trace context, on the endpoint's subject; the
 * `{ ok, data }` reply read with the endpoint's schema; and NATS's errors (no dispatcher, a
 * refused subject, no reply in time) said as Boxcar's.
 */

import { TRACEPARENT, traceparentOf } from "@boxcar/common";
import {
  API_CONTRACT,
  type ApiEndpoint,
  ApiReply,
  type ApiReplyData,
  BoxcarError,
  ErrorCode,
  type Identity,
  parseWith,
} from "@boxcar/protocol";
import { errors as natsErrors, headers as natsHeaders } from "@nats-io/transport-node";
import type { z } from "zod";
import type { ClientLink } from "./chain-events.js";

/** Asks the dispatchers of the system `link` reaches, as `identity`, waiting `timeoutMs` for a reply unless told otherwise. */
export class DispatcherApi {
  constructor(
    readonly link: ClientLink,
    readonly timeoutMs: number,
    readonly identity: Identity,
  ) {}

  /**
   * Asks an endpoint and reads its reply's data with the endpoint's schema in `API_CONTRACT`;
   * the caller's active trace, if any, goes along (`traceparent`), so the dispatcher's span joins it.
   */
  async request<E extends ApiEndpoint>(endpoint: E, body: unknown, timeoutMs = this.timeoutMs): Promise<ApiReplyData<E>> {
    const traceparent = traceparentOf();
    const headers = traceparent ? natsHeaders() : undefined;
    if (traceparent) headers?.set(TRACEPARENT, traceparent);
    const schema = API_CONTRACT[endpoint].reply as unknown as z.ZodType<ApiReplyData<E>>;
    return this.ask(this.link.names.subjects.api(this.identity, endpoint), JSON.stringify(body), schema, headers, timeoutMs);
  }

  /** Sends a request and reads the `{ ok, data }` reply; NATS's errors become Boxcar's. */
  async ask<S extends z.ZodType>(
    subject: string,
    body: string | Uint8Array,
    schema: S,
    headers?: ReturnType<typeof natsHeaders>,
    timeoutMs = this.timeoutMs,
  ): Promise<z.infer<S>> {
    let reply: Uint8Array;
    try {
      const msg = await this.link.nc.request(subject, body, { timeout: timeoutMs, ...(headers ? { headers } : {}) });
      reply = msg.data;
    } catch (err) {
      if (err instanceof natsErrors.NoRespondersError || (err instanceof natsErrors.RequestError && err.isNoResponders())) {
        throw new BoxcarError(
          ErrorCode.unavailable,
          `no dispatcher answers on ${subject}: is one running, with prefix ${this.link.names.prefix}?`,
          { cause: err },
        );
      }
      const denied = err instanceof natsErrors.PermissionViolationError ? err : (err as Error).cause;
      if (denied instanceof natsErrors.PermissionViolationError) {
        throw new BoxcarError(
          ErrorCode.forbidden,
          `NATS refused ${subject}: the credential of ${this.identity.role} ${this.identity.user} may not publish there`,
          { cause: err },
        );
      }
      if (err instanceof natsErrors.TimeoutError) {
        throw new BoxcarError(ErrorCode.unavailable, `no reply on ${subject} within ${this.timeoutMs} ms`, { cause: err });
      }
      throw err;
    }
    const parsed = parseWith(ApiReply, JSON.parse(new TextDecoder().decode(reply)), `reply from ${subject}`);
    if (!parsed.ok) throw BoxcarError.fromInfo(parsed.error);
    return parseWith(schema, parsed.data, `reply from ${subject}`);
  }
}
