/**
 * Terminal colour codes (ANSI SGR: `ESC [ … m`) in an agent's output, turned into runs of text
 * with the classes (and, for 256-colour and 24-bit codes, the colour) to show them with. The
 * text stays text: the page puts each run in a span as a child, never as HTML, and every other
 * escape sequence (cursor moves, titles, hyperlinks) is dropped.
 */

/** One run of text and how it looks. */
export interface StyledRun {
  readonly text: string;
  /** `ansi-fg-red ansi-bold …`; empty for plain text. */
  readonly classes: string;
  /** A colour no class names (256-colour and 24-bit codes), as `rgb(r, g, b)`, made of numbers only. */
  readonly color?: string;
  readonly background?: string;
}

const NAMES = ["black", "red", "green", "yellow", "blue", "magenta", "cyan", "white"] as const;

/** What the codes so far have set. */
interface Pen {
  bold: boolean;
  dim: boolean;
  italic: boolean;
  underline: boolean;
  inverse: boolean;
  strike: boolean;
  /** A class's colour name (`red`, `bright-red`) or an `rgb(…)`. */
  fg?: string;
  bg?: string;
}

const plain = (): Pen => ({ bold: false, dim: false, italic: false, underline: false, inverse: false, strike: false });

const ESCAPES =
  // biome-ignore lint/suspicious/noControlCharactersInRegex: escape sequences are what is matched
  /\x1b(?:\[([0-9;:?<=>]*)([ -/]*)([@-~])|\][^\x07\x1b]*(?:\x07|\x1b\\)?|[ -/]*[0-~]|)|[\x00-\x08\x0b\x0c\x0e-\x1a\x1c-\x1f\x7f]/g;

/** `text` as styled runs: SGR codes applied, other escapes and control characters (not tab or newline) dropped. */
export function ansiRuns(text: string): StyledRun[] {
  const runs: StyledRun[] = [];
  let pen = plain();
  let at = 0;
  const push = (piece: string) => {
    if (piece === "") return;
    const styled = style(pen);
    const last = runs.at(-1);
    if (last && last.classes === styled.classes && last.color === styled.color && last.background === styled.background) {
      runs[runs.length - 1] = { ...last, text: last.text + piece };
    } else runs.push({ text: piece, ...styled });
  };
  // Nothing to parse in most output: one run, at once.
  // biome-ignore lint/suspicious/noControlCharactersInRegex: control characters are what is looked for
  if (!/[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]/.test(text)) return text === "" ? [] : [{ text, classes: "" }];
  for (const m of text.matchAll(ESCAPES)) {
    push(text.slice(at, m.index));
    at = m.index + m[0].length;
    if (m[3] === "m" && m[2] === "" && /^[0-9;:]*$/.test(m[1] ?? "")) pen = apply(pen, m[1] ?? "");
  }
  push(text.slice(at));
  return runs;
}

/** The pen after one SGR sequence's parameters (`1;31`, `38;5;208`, `38;2;255;128;0`; `:` taken as `;`). */
function apply(from: Pen, params: string): Pen {
  const pen = { ...from };
  const codes = params === "" ? [0] : params.split(/[;:]/).map((p) => (p === "" ? 0 : Number(p)));
  for (let i = 0; i < codes.length; i++) {
    const c = codes[i] as number;
    if (c === 0) Object.assign(pen, plain(), { fg: undefined, bg: undefined });
    else if (c === 1) pen.bold = true;
    else if (c === 2) pen.dim = true;
    else if (c === 3) pen.italic = true;
    else if (c === 4) pen.underline = true;
    else if (c === 7) pen.inverse = true;
    else if (c === 9) pen.strike = true;
    else if (c === 22) pen.bold = pen.dim = false;
    else if (c === 23) pen.italic = false;
    else if (c === 24) pen.underline = false;
    else if (c === 27) pen.inverse = false;
    else if (c === 29) pen.strike = false;
    else if (c >= 30 && c <= 37) pen.fg = NAMES[c - 30];
    else if (c === 39) pen.fg = undefined;
    else if (c >= 40 && c <= 47) pen.bg = NAMES[c - 40];
    else if (c === 49) pen.bg = undefined;
    else if (c >= 90 && c <= 97) pen.fg = `bright-${NAMES[c - 90]}`;
    else if (c >= 100 && c <= 107) pen.bg = `bright-${NAMES[c - 100]}`;
    else if (c === 38 || c === 48) {
      // 5;n: the 256-colour palette; 2;r;g;b: a colour of its own.
      let colour: string | undefined;
      if (codes[i + 1] === 5) {
        colour = palette(codes[i + 2] ?? 0);
        i += 2;
      } else if (codes[i + 1] === 2) {
        colour = rgb(codes[i + 2] ?? 0, codes[i + 3] ?? 0, codes[i + 4] ?? 0);
        i += 4;
      } else break; // malformed: the rest of the sequence means nothing
      if (c === 38) pen.fg = colour;
      else pen.bg = colour;
    }
  }
  return pen;
}

function style(pen: Pen): Omit<StyledRun, "text"> {
  const [fg, bg] = pen.inverse ? [pen.bg ?? "default-bg", pen.fg ?? "default-fg"] : [pen.fg, pen.bg];
  const classes: string[] = [];
  let color: string | undefined;
  let background: string | undefined;
  if (fg?.startsWith("rgb(")) color = fg;
  else if (fg) classes.push(`ansi-fg-${fg}`);
  if (bg?.startsWith("rgb(")) background = bg;
  else if (bg) classes.push(`ansi-bg-${bg}`);
  if (pen.bold) classes.push("ansi-bold");
  if (pen.dim) classes.push("ansi-dim");
  if (pen.italic) classes.push("ansi-italic");
  if (pen.underline) classes.push("ansi-underline");
  if (pen.strike) classes.push("ansi-strike");
  return { classes: classes.join(" "), ...(color ? { color } : {}), ...(background ? { background } : {}) };
}

/** A colour of the 256-colour palette: the 16 named ones as classes, the cube and the greys as `rgb(…)`. */
function palette(n: number): string {
  const i = Math.max(0, Math.min(255, Math.trunc(n)));
  if (i < 8) return NAMES[i] as string;
  if (i < 16) return `bright-${NAMES[i - 8]}`;
  if (i >= 232) {
    const v = 8 + (i - 232) * 10;
    return rgb(v, v, v);
  }
  const cube = i - 16;
  const level = (k: number) => (k === 0 ? 0 : 55 + k * 40);
  return rgb(level(Math.floor(cube / 36)), level(Math.floor(cube / 6) % 6), level(cube % 6));
}

function rgb(r: number, g: number, b: number): string {
  const c = (v: number) => Math.max(0, Math.min(255, Math.trunc(Number.isFinite(v) ? v : 0)));
  return `rgb(${c(r)}, ${c(g)}, ${c(b)})`;
}
