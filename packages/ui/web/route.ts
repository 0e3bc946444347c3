/** The page's place, in the URL's fragment: `#/jobs?state=failed`, `#/job/ID`, `#/runs`, `#/run/ID`, `#/workers`, `#/dead`. */

export interface Route {
  readonly view: string;
  readonly id?: string;
  readonly params: URLSearchParams;
}

export function currentRoute(): Route {
  const [path = "", query = ""] = location.hash.replace(/^#\/?/, "").split("?", 2);
  const [view = "jobs", id] = path.split("/").map(decodeOr);
  return { view: view || "jobs", ...(id ? { id } : {}), params: new URLSearchParams(query) };
}

/** The link to `view` with `params`, each set one kept and each empty one left out. */
export function hrefOf(view: string, params: URLSearchParams | Record<string, string> = {}): string {
  const query = new URLSearchParams([...new URLSearchParams(params)].filter(([, v]) => v !== "")).toString();
  return `#/${view}${query ? `?${query}` : ""}`;
}

export function navigate(view: string, params?: URLSearchParams | Record<string, string>): void {
  location.hash = hrefOf(view, params);
}

/** A path segment decoded; a malformed escape (`%zz`) is kept as it is, to be not found. */
function decodeOr(segment: string): string {
  try {
    return decodeURIComponent(segment);
  } catch {
    return segment;
  }
}
