import { describe, expect, test } from "vitest";
import { render, TemplateError, truthy } from "./template.js";
import { FileError, parseWorkflowFile } from "./yaml-file.js";

const issuesOf = (text: string) => {
  try {
    parseWorkflowFile(text, "wf.yaml");
  } catch (err) {
    if (err instanceof FileError) return err.locations.map((l) => `${l.line}: ${l.path}: ${l.message}`);
    throw err;
  }
  return [];
};

describe("workflow files", () => {
  test("a valid file parses with defaults filled", () => {
    const wf = parseWorkflowFile(
      `name: research
steps:
  - name: plan
    agent: planner
  - name: dig
    agent: digger
    needs: [plan]
    forEach: "{{ steps.plan.output.questions }}"
    input: { q: "{{ item }}", n: "{{ index }}" }
    timeout: 2m
`,
      "wf.yaml",
    );
    expect(wf.limits).toEqual({ maxHops: 10, maxVisits: 5 });
    expect(wf.steps[1]).toMatchObject({ needs: ["plan"], files: "needs", timeout: 120_000 });
  });

  test("a cycle, an unknown step and a repeated name are errors at their line", () => {
    expect(
      issuesOf(`name: bad
steps:
  - name: a
    agent: x
    needs: [c]
  - name: b
    agent: x
    needs: [nope]
  - name: c
    agent: x
    needs: [a]
`),
    ).toEqual(['8: steps[1].needs[0]: no step named "nope"']);
    expect(
      issuesOf(`name: bad
steps:
  - name: a
    agent: x
    needs: [b]
  - name: b
    agent: x
    needs: [a]
`),
    ).toEqual(["5: steps[0].needs: needs form a cycle: a → b → a"]);
    expect(
      issuesOf(`name: bad
steps:
  - name: a
    agent: x
  - name: a
    agent: y
`),
    ).toEqual(["5: steps[1].name: another step is also named a"]);
  });

  test("template references are checked: roots, upstream steps, item outside a fan-out, syntax", () => {
    expect(
      issuesOf(`name: bad
steps:
  - name: a
    agent: x
    input: "{{ steps.b.output }}"
  - name: b
    agent: x
    needs: [a]
    input:
      q: "{{ item }}"
      r: "{{ env.HOME }}"
      s: "{{ steps.a.result }}"
      t: "{{ steps.a.output == approve }}"
      u: "{{ steps.ghost.output }}"
`),
    ).toEqual([
      "5: steps[0].input: step b is not among the steps a needs (directly or not): add it to needs",
      "10: steps[1].input.q: {{ item }} is only defined in the input of a step with forEach",
      "11: steps[1].input.r: {{ env.HOME }}: a reference starts with input, steps, item or index",
      "12: steps[1].input.s: {{ steps.a.result }}: write steps.<name>.output, .summary or .state",
      '13: steps[1].input.t: approve is not a JSON literal (quote strings: "approve")',
      '14: steps[1].input.u: no step named "ghost"',
    ]);
  });

  test("forEach and if hold one template", () => {
    expect(issuesOf(`name: bad\nsteps:\n  - name: a\n    agent: x\n    if: yes please\n`)).toEqual([
      '5: steps[0].if: expected one template such as "{{ steps.plan.output.ok }}"',
    ]);
  });
});

describe("templates", () => {
  const scope = { input: { topic: "queues", n: 3, list: [1, 2] }, steps: { plan: { output: { ok: true, items: ["a"] } } } };

  test("a whole-string template keeps the value's type; a template inside text is written in", () => {
    expect(render({ a: "{{ input.list }}", b: "topic: {{ input.topic }} x{{ input.n }}", c: ["{{ input.list[1] }}"] }, scope)).toEqual({
      a: [1, 2],
      b: "topic: queues x3",
      c: [2],
    });
  });

  test("negation and comparison with JSON literals", () => {
    expect(render("{{ !steps.plan.output.ok }}", scope)).toBe(false);
    expect(render('{{ input.topic == "queues" }}', scope)).toBe(true);
    expect(render("{{ input.n != 3 }}", scope)).toBe(false);
    expect([[], {}, "", 0, null, false].some(truthy)).toBe(false);
  });

  test("a missing value is an error naming the reference", () => {
    expect(() => render("{{ steps.plan.output.missing }}", scope)).toThrow(
      new TemplateError('steps.plan.output.missing is not there (no "missing")'),
    );
  });
});
