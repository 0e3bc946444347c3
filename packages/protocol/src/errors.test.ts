import { expect, test } from "vitest";
import { BoxcarError, ErrorCode, ValidationError } from "./errors.js";

test("a BoxcarError of another copy of the package is a BoxcarError here (the bundled CLI beside the role packages); subclasses check as usual", async () => {
  // Another copy: the built module under another URL is a module of its own.
  const other = (await import(
    /* @vite-ignore */ `${new URL("../dist/errors.js", import.meta.url).href}?another-copy`
  )) as typeof import("./errors.js");
  expect(other.BoxcarError).not.toBe(BoxcarError);
  const theirs = new other.BoxcarError(ErrorCode.storageFull, "full");
  expect(theirs).toBeInstanceOf(BoxcarError);
  expect(new BoxcarError(ErrorCode.notFound, "none")).toBeInstanceOf(other.BoxcarError);
  expect(new other.ValidationError("bad", [])).toBeInstanceOf(BoxcarError);
  expect(new Error("plain")).not.toBeInstanceOf(BoxcarError);
  expect({ code: ErrorCode.notFound }).not.toBeInstanceOf(BoxcarError);
  for (const value of [null, undefined, "BoxcarError", 0]) expect(value).not.toBeInstanceOf(BoxcarError);
  // A subclass of another copy is a BoxcarError here, but not this copy's subclass.
  expect(new other.ValidationError("bad", [])).not.toBeInstanceOf(ValidationError);
  // A subclass is still its own: a BoxcarError is not a ValidationError.
  expect(new BoxcarError(ErrorCode.invalid, "x")).not.toBeInstanceOf(ValidationError);
  expect(new ValidationError("bad", [])).toBeInstanceOf(ValidationError);
});
