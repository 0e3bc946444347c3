/**
 * Polls `check` every 100 ms until it returns a value that is not undefined, or fails after `ms`,
 * naming `what` it waited for (a function is asked at the end, to say what it saw last).
 */
export async function eventually<T>(check: () => Promise<T | undefined>, what: string | (() => string), ms = 20_000): Promise<T> {
  const deadline = Date.now() + ms;
  while (Date.now() < deadline) {
    const value = await check();
    if (value !== undefined) return value;
    await new Promise((r) => setTimeout(r, 100));
  }
  throw new Error(`timed out waiting for ${typeof what === "function" ? what() : what}`);
}
