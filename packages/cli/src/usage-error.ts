/** A wrong command line: unknown command or flag, missing or malformed argument. */
export class UsageError extends Error {
  override readonly name = "UsageError";
}
