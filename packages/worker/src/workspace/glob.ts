// Compiles a workspace glob to a RegExp over `/`-separated relative paths: `*` matches within one
// segment, `?` one character of a segment, and `**` any number of segments (`a/**` matches all
// files under `a`; `**/x` matches an `x` at any depth). Every other character matches itself.
export function globToRegExp(glob: string): RegExp {
  let source = "";
  for (let i = 0; i < glob.length; i++) {
    const c = glob.charAt(i);
    if (c === "*" && glob[i + 1] === "*") {
      const wholeSegment = (i === 0 || glob[i - 1] === "/") && (i + 2 === glob.length || glob[i + 2] === "/");
      if (wholeSegment && glob[i + 2] === "/") {
        source += "(?:[^/]*/)*"; // zero or more folders
        i += 2;
      } else {
        source += ".*";
        i += 1;
      }
    } else if (c === "*") source += "[^/]*";
    else if (c === "?") source += "[^/]";
    else source += c.replace(/[\\^$.|+()[\]{}]/g, "\\$&");
  }
  return new RegExp(`^${source}$`);
}

/** A predicate that is true for paths matching any of `globs`. */
export function globMatcher(globs: readonly string[]): (path: string) => boolean {
  const patterns = globs.map(globToRegExp);
  return (path) => patterns.some((p) => p.test(path));
}

/**
 * The folders every path some glob of `globs` matches lies under (the segments before a glob's
 * first `*` or `?`), with none inside another; undefined when a glob can match a file at the top
 * of the workspace, so the whole workspace is to be looked at.
 */
export function globRoots(globs: readonly string[]): string[] | undefined {
  const roots: string[] = [];
  for (const glob of globs) {
    const folders = glob.split("/").slice(0, -1);
    const wild = folders.findIndex((segment) => /[*?]/.test(segment));
    const fixed = wild === -1 ? folders : folders.slice(0, wild);
    if (fixed.length === 0) return undefined;
    roots.push(fixed.join("/"));
  }
  const sorted = [...new Set(roots)].sort();
  return sorted.filter((root) => !sorted.some((other) => other !== root && root.startsWith(`${other}/`)));
}
