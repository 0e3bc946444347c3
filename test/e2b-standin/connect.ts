import type { IncomingMessage, ServerResponse } from "node:http";

/**
 * The parts of the Connect protocol (https://connectrpc.com/docs/protocol) the `e2b` SDK uses
 * to talk to a sandbox daemon: its transport is `createConnectTransport({ useBinaryFormat:
 * false })`, so unary calls are JSON bodies and server-streaming calls are enveloped JSON.
 */

/** Connect error codes, as they travel in JSON. */
export type ConnectCode =
  | "canceled"
  | "unknown"
  | "invalid_argument"
  | "deadline_exceeded"
  | "not_found"
  | "already_exists"
  | "permission_denied"
  | "resource_exhausted"
  | "failed_precondition"
  | "unimplemented"
  | "internal"
  | "unavailable"
  | "unauthenticated";

/** An error a handler throws to answer with a Connect error. */
export class ConnectError extends Error {
  override readonly name = "ConnectError";
  constructor(
    readonly code: ConnectCode,
    message: string,
  ) {
    super(message);
  }
}

const HTTP_STATUS: Record<ConnectCode, number> = {
  canceled: 499,
  unknown: 500,
  invalid_argument: 400,
  deadline_exceeded: 504,
  not_found: 404,
  already_exists: 409,
  permission_denied: 403,
  resource_exhausted: 429,
  failed_precondition: 400,
  unimplemented: 501,
  internal: 500,
  unavailable: 503,
  unauthenticated: 401,
};

const FLAG_END_STREAM = 0b10;

export async function readBody(req: IncomingMessage): Promise<Buffer> {
  const chunks: Buffer[] = [];
  for await (const chunk of req) chunks.push(chunk as Buffer);
  return Buffer.concat(chunks);
}

/** The JSON message of a unary request (`Content-Type: application/json`). */
export async function readUnaryRequest(req: IncomingMessage): Promise<Record<string, unknown>> {
  const type = req.headers["content-type"] ?? "";
  if (!type.startsWith("application/json")) throw new ConnectError("invalid_argument", `unsupported content type ${type}`);
  const body = await readBody(req);
  return body.length === 0 ? {} : (JSON.parse(body.toString("utf8")) as Record<string, unknown>);
}

/** The one enveloped JSON message of a server-streaming request (`application/connect+json`). */
export async function readStreamRequest(req: IncomingMessage): Promise<Record<string, unknown>> {
  const type = req.headers["content-type"] ?? "";
  if (!type.startsWith("application/connect+json")) throw new ConnectError("invalid_argument", `unsupported content type ${type}`);
  const body = await readBody(req);
  if (body.length < 5) throw new ConnectError("invalid_argument", "the request has no message envelope");
  const length = body.readUInt32BE(1);
  return JSON.parse(body.subarray(5, 5 + length).toString("utf8")) as Record<string, unknown>;
}

export function sendUnary(res: ServerResponse, message: object): void {
  const body = JSON.stringify(message);
  res.writeHead(200, { "content-type": "application/json", "content-length": Buffer.byteLength(body) });
  res.end(body);
}

export function sendUnaryError(res: ServerResponse, err: ConnectError): void {
  const body = JSON.stringify({ code: err.code, message: err.message });
  res.writeHead(HTTP_STATUS[err.code], { "content-type": "application/json", "content-length": Buffer.byteLength(body) });
  res.end(body);
}

/** The response of a server-streaming call: messages, then one end-of-stream envelope. */
export class ResponseStream {
  private ended = false;

  constructor(private readonly res: ServerResponse) {
    res.writeHead(200, { "content-type": "application/connect+json" });
    res.once("close", () => {
      this.ended = true;
    });
  }

  /** False once the client went away or the stream ended. */
  get open(): boolean {
    return !this.ended;
  }

  send(message: object): void {
    if (!this.ended) this.res.write(envelope(0, message));
  }

  end(error?: ConnectError): void {
    if (this.ended) return;
    this.ended = true;
    this.res.end(envelope(FLAG_END_STREAM, error ? { error: { code: error.code, message: error.message } } : {}));
  }
}

function envelope(flags: number, message: object): Buffer {
  const json = Buffer.from(JSON.stringify(message), "utf8");
  const head = Buffer.alloc(5);
  head.writeUInt8(flags, 0);
  head.writeUInt32BE(json.length, 1);
  return Buffer.concat([head, json]);
}
