/**
 * The last `most` values shown, so what every dispatcher's watch shows again (a record written
 * twice, a replay) is acted on once: `first` is true the first time a value is shown, and the
 * oldest value is forgotten past `most`.
 */
export class SeenOnce {
  private readonly seen = new Set<string>();

  constructor(private readonly most = 10_000) {}

  first(value: string): boolean {
    if (this.seen.has(value)) return false;
    this.seen.add(value);
    if (this.seen.size > this.most) this.seen.delete(this.seen.values().next().value as string);
    return true;
  }

  /** Forgets `value`: shown again, it is a first time (a pass that failed is tried again). */
  forget(value: string): void {
    this.seen.delete(value);
  }
}
