import { expect, test } from "vitest";
import { AgentDefinition, credentialLikeEnv } from "./agent.js";

test("env values that look like credentials are named, with the fix; ordinary settings pass", () => {
  const flagged = credentialLikeEnv({
    OPENAI_API_KEY: "sk-proj-abcdefghijklmnopqrstuvwx",
    MODEL: "gpt-4o",
    GITHUB: "ghp_0123456789abcdefghijABCDEFGHIJ",
    AWS: "AKIAIOSFODNN7EXAMPLE",
    DB_PASSWORD: "hunter2hunter2",
    SESSION: "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.sig",
    TOKEN_LIMIT: "4096",
    KEY_HINT: "use the staging key",
    LOG_LEVEL: "debug",
  });
  expect(flagged.map((i) => i.path)).toEqual(["env.OPENAI_API_KEY", "env.GITHUB", "env.AWS", "env.DB_PASSWORD", "env.SESSION"]);
  expect(flagged[0]?.message).toContain("secrets: [OPENAI_API_KEY]");
  expect(credentialLikeEnv({})).toEqual([]);
});

test("a command whose program starts with '-' is refused: the lifeline's shell would read it as an option to exec", () => {
  const refused = AgentDefinition.safeParse({ name: "dash", command: ["-agent", "x"] });
  expect(refused.success).toBe(false);
  expect(refused.error?.issues[0]).toMatchObject({ path: ["command"], message: expect.stringContaining("may not start with '-'") });
  expect(AgentDefinition.safeParse({ name: "ok", command: ["agent", "-x"] }).success).toBe(true);
});

test("a wrong rateLimit.starts is the one error: burst, which the user did not set, is not blamed for it", () => {
  const refused = AgentDefinition.safeParse({ name: "a", command: "true", rateLimit: { starts: 0, per: "1m" } });
  expect(refused.error?.issues.map((i) => i.path.join("."))).toEqual(["rateLimit.starts"]);
  const tooBig = AgentDefinition.safeParse({ name: "a", command: "true", rateLimit: { starts: 2, per: "1m", burst: 3 } });
  expect(tooBig.error?.issues.map((i) => `${i.path.join(".")}: ${i.message}`)).toEqual([
    "rateLimit.burst: burst cannot be more than starts",
  ]);
});
