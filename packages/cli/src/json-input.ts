import { readFile } from "node:fs/promises";
import type { Values } from "./command.js";
import { UsageError } from "./usage-error.js";

/** A file the user named, read whole; a usage error that names it when it cannot be read. */
export async function readText(file: string, what: string): Promise<string> {
  try {
    return await readFile(file, "utf8");
  } catch (err) {
    throw new UsageError(`cannot read ${what} ${file}: ${(err as Error).message}`);
  }
}

/** A signal's `--payload JSON`: null without one. */
export function jsonPayload(values: Values): unknown {
  const text = values.payload as string | undefined;
  if (text === undefined) return null;
  try {
    return JSON.parse(text);
  } catch (err) {
    throw new UsageError(`--payload is not valid JSON: ${(err as Error).message}`);
  }
}

/**
 * The input of a job or run: `--input JSON`, or the JSON in `--input-file FILE` (for one larger
 * than a command-line argument may be: 128 KiB on Linux); undefined without either.
 */
export async function jsonInput(values: Values): Promise<unknown> {
  const inline = values.input as string | undefined;
  const file = values["input-file"] as string | undefined;
  if (inline !== undefined && file !== undefined) throw new UsageError("give --input or --input-file, not both");
  if (inline === undefined && file === undefined) return undefined;
  const [flag, text] = inline !== undefined ? ["--input", inline] : [`--input-file ${file}`, await readText(file as string, "input file")];
  try {
    return JSON.parse(text);
  } catch (err) {
    throw new UsageError(`${flag} is not valid JSON: ${(err as Error).message}`);
  }
}
