import { localSystem } from "@boxcar/testing";
import { describe, expect, test } from "vitest";

/**
 * A prompt agent against the real providers (docs/harness.md), run only when a key is set:
 * `ANTHROPIC_API_KEY` (model `BOXCAR_LIVE_ANTHROPIC_MODEL`, default claude-3-5-haiku-latest) or
 * `OPENAI_API_KEY` (`BOXCAR_LIVE_OPENAI_MODEL`, default gpt-4o-mini). It has not run here: no
 * model API is reachable from this machine.
 */
const LIVE = [
  {
    provider: "anthropic",
    key: process.env.ANTHROPIC_API_KEY,
    model: process.env.BOXCAR_LIVE_ANTHROPIC_MODEL ?? "claude-3-5-haiku-latest",
  },
  { provider: "openai", key: process.env.OPENAI_API_KEY, model: process.env.BOXCAR_LIVE_OPENAI_MODEL ?? "gpt-4o-mini" },
] as const;

describe("live: a prompt agent on the real providers", () => {
  for (const { provider, key, model } of LIVE) {
    test.skipIf(!key)(
      `${provider}: uses its bash tool and answers from what it ran`,
      async () => {
        await using system = await localSystem({ worker: { modelGateway: { providers: { [provider]: { key: key as string } } } } });
        await system.client.applyAgent({
          name: "live-calculator",
          prompt: {
            model: `${provider}/${model}`,
            template: "Use the bash tool to run `echo $((6 * 7))`, then answer with the number it printed and nothing else.",
            tools: ["bash"],
            maxSteps: 5,
          },
          runtime: { sandbox: "host" },
          trusted: true,
        });
        const { job } = await system.client.submit({ agent: "live-calculator", input: {} });
        const done = await system.client.waitForJob(job.id);
        expect(done.state, JSON.stringify(done.error)).toBe("succeeded");
        expect(String((done.result?.output as { text?: string } | undefined)?.text)).toContain("42");
        const tools = [];
        for await (const e of system.client.events(job.id)) if (e.kind === "job" && e.type === "tool_call") tools.push(e.step?.tool?.name);
        expect(tools).toContain("bash");
      },
      120_000,
    );
  }
});
