import type { Model, ToolCall, Turn } from "./agent-loop.js";

/** The task the scripted model knows. */
export const DEMO_TASK = "Write a Python script that prints the first ten prime numbers, run it, and tell me what it printed.";

const PRIMES_PY = `def primes(n):
    found = []
    k = 2
    while len(found) < n:
        if all(k % p for p in found):
            found.append(k)
        k += 1
    return found

print(" ".join(str(p) for p in primes(10)))
`;

/**
 * A stand-in for a model that follows one script for `DEMO_TASK`, so the example runs offline
 * and in CI: it writes the script, runs it, and answers with what the run printed (read from the
 * tool's result, so the answer comes from the sandbox, not from this file). Any other task: it
 * says it only knows the demo.
 */
export function scriptedModel(): Model {
  return {
    async next(turns: readonly Turn[]) {
      const task = turns[0]?.role === "user" ? turns[0].text : "";
      if (task !== DEMO_TASK)
        return { text: "I am the scripted stand-in: I only know the demo task (set ANTHROPIC_API_KEY for a real model).", calls: [] };
      const steps = turns.filter((t) => t.role === "assistant").length;
      const call = (c: Omit<ToolCall, "id">): ToolCall => ({ ...c, id: `call-${steps + 1}` }) as ToolCall;
      if (steps === 0)
        return {
          text: "I will write the script.",
          calls: [call({ name: "write_file", input: { path: "primes.py", content: PRIMES_PY } })],
        };
      if (steps === 1) return { text: "Now I run it.", calls: [call({ name: "bash", input: { command: "python3 primes.py" } })] };
      const last = turns.at(-1);
      const output = last?.role === "tools" ? (last.results[0]?.output ?? "") : "";
      const printed = output.split("\n").slice(1).join("\n").trim();
      return { text: `It printed: ${printed}`, calls: [] };
    },
  };
}
