import { z } from "zod";

/** The roles a user holds one of: what its credential lets it publish and subscribe to (`access.ts`). */
export const Role = z.enum(["admin", "dispatcher", "worker", "submitter", "viewer"]);
export type Role = z.infer<typeof Role>;
export const ROLES: readonly Role[] = Role.options;

/** The principal a request comes from. */
export interface Identity {
  readonly role: Role;
  readonly user: string;
}
