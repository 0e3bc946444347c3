import { z } from "zod";

/** A session's id (docs/sessions.md); in a file of its own because job specs name sessions too. */
export const SessionId = z.string().regex(/^ses-[A-Za-z0-9_-]{1,60}$/, "a session id is ses- and letters, digits, '-' or '_'");
