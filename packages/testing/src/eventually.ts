/** Polls `check` every 100 ms until it returns a value that is not undefined, or fails after `ms`, naming `what` it waited for. */
export async function eventually<T>(check: () => Promise<T | undefined>, what: string, ms = 20_000): Promise<T> {
  const deadline = Date.now() + ms;
  while (Date.now() < deadline) {
    const value = await check();
    if (value !== undefined) return value;
    await new Promise((r) => setTimeout(r, 100));
  }
  throw new Error(`timed out waiting for ${what}`);
}
