import { z } from "zod";
import { MODEL_NAME } from "./usage.js";

/**
 * The model providers an agent reaches through its worker's model gateway (docs/models.md): the
 * gateway speaks each one's own wire format, holds its key, and meters every call.
 */
export const ModelProvider = z.enum(["anthropic", "openai"]);
export type ModelProvider = z.infer<typeof ModelProvider>;
export const MODEL_PROVIDERS: readonly ModelProvider[] = ModelProvider.options;

/** What an agent's definition says of its models: the providers it may call, whose keys its worker holds. */
export const AgentModels = z.strictObject({
  providers: z
    .array(ModelProvider)
    .min(1)
    .refine((list) => new Set(list).size === list.length, "a provider is listed twice")
    .describe("the providers it may call through the worker's gateway: anthropic, openai"),
  record: z
    .boolean()
    .optional()
    .describe(
      "keep each call's answer with the job, so that a later attempt sending the same request at the same place in its sequence gets it again without calling the provider (docs/models.md#recorded-calls)",
    ),
});
export type AgentModels = z.infer<typeof AgentModels>;

/** What a worker's model gateway offers, as its presence says: the providers whose keys it holds, and whether sandboxes off its machine (E2B) can reach it. */
export const GatewayReach = z.strictObject({
  providers: z.array(ModelProvider),
  /** It has a public address (`--model-gateway-url`). */
  public: z.boolean(),
});
export type GatewayReach = z.infer<typeof GatewayReach>;

/** One call an agent made through the gateway, as its `model_call` event says (never the prompt or the answer). */
export const ModelCall = z.strictObject({
  provider: ModelProvider,
  /** The model the provider answered with (else the one asked for); absent when neither was readable. */
  model: z.string().regex(MODEL_NAME).optional(),
  /** The endpoint called, below the provider's base: `/v1/messages`, `/chat/completions`, `/responses`. */
  endpoint: z.string().max(256),
  /** The HTTP status the agent got (the provider's own, or the gateway's when the provider could not be reached). */
  status: z.number().int(),
  stream: z.boolean(),
  /** From the request to the end of the answer, and to its first byte. */
  latencyMs: z.number().nonnegative(),
  firstByteMs: z.number().nonnegative().optional(),
  tokensIn: z.number().int().nonnegative(),
  tokensOut: z.number().int().nonnegative(),
  /** Of the tokens in: read from the provider's prompt cache, and written to it (as the provider reports them). */
  cacheReadTokens: z.number().int().nonnegative().optional(),
  cacheWriteTokens: z.number().int().nonnegative().optional(),
  /** What it cost by the system policy's prices (0 for a model with none, and for a replayed call). */
  cost: z.number().min(0).optional(),
  /** Answered from the job's recording of an earlier attempt: the provider was not called (its tokens are the recorded call's, and count for nothing new). */
  replayed: z.boolean().optional(),
  /**
   * The gateway answered it itself, the provider not called: `budget` (a budget that stops is
   * spent) or `limit` (the fleet's model limit is reached). Such a call counts for no usage.
   */
  refused: z.enum(["budget", "limit"]).optional(),
});
export type ModelCall = z.infer<typeof ModelCall>;

/** The Object Store object a job's recorded model call at `position` (from 1) is kept in (docs/models.md#recorded-calls). */
export function recordedCallObject(jobId: string, position: number): string {
  return `modelcalls/${jobId}/${position}`;
}
