/** Runs the command line in this process: `boxcar.ts` loads it, from the bundle or not. */
import { main } from "../main.js";

// Output piped into a reader that stops early (`| head`): stop quietly, as other tools do.
process.stdout.on("error", (err: NodeJS.ErrnoException) => {
  if (err.code === "EPIPE") process.exit(0);
  throw err;
});

const controller = new AbortController();
let signals = 0;
for (const signal of ["SIGINT", "SIGTERM"] as const) {
  process.on(signal, () => {
    signals += 1;
    if (signals > 1) process.exit(130); // a second Ctrl-C: stop waiting for a clean shutdown
    controller.abort();
  });
}

const code = await main(process.argv.slice(2), {
  stdin: process.stdin,
  stdout: process.stdout,
  stderr: process.stderr,
  env: process.env,
  signal: controller.signal,
});
process.exitCode = code;
// Anything still holding the event loop (a stray timer, a socket) must not keep a finished CLI alive.
setTimeout(() => process.exit(code), 2_000).unref();
