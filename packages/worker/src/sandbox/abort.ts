/**
 * The step's result, or undefined as soon as `signal` aborts (the step is then left to settle
 * on its own, its failure ignored): how sandboxes stop waiting on a slow engine or API call.
 */
export function raceAbort<T>(step: Promise<T>, signal: AbortSignal | undefined): Promise<T | undefined> {
  if (!signal) return step;
  if (signal.aborted) {
    step.catch(() => {});
    return Promise.resolve(undefined);
  }
  return new Promise<T | undefined>((resolve, reject) => {
    const onAbort = () => {
      step.catch(() => {});
      resolve(undefined);
    };
    signal.addEventListener("abort", onAbort, { once: true });
    step.then(
      (value) => {
        signal.removeEventListener("abort", onAbort);
        resolve(value);
      },
      (err: unknown) => {
        signal.removeEventListener("abort", onAbort);
        reject(err);
      },
    );
  });
}
