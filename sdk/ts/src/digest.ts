// The arguments digest of a step call (docs/other-languages.md, "The arguments
// digest"): SHA-256, in lowercase hex, of the canonical JSON text of `[args, {}]`.
// Recorded with the call, it lets a replay tell that a recorded call is now made with
// other arguments. The rule is the Python SDK's, so that a body journaled by a worker
// of one language replays on a worker of the other.

import { createHash } from "node:crypto";

import { toPlainJson, type JsonValue } from "./json.js";

/** Compares two strings by code point, as Python sorts keys (not by UTF-16 unit). */
function byCodePoint(a: string, b: string): number {
  const x = [...a];
  const y = [...b];
  for (let i = 0; i < Math.min(x.length, y.length); i++) {
    const d = (x[i].codePointAt(0) as number) - (y[i].codePointAt(0) as number);
    if (d !== 0) return d;
  }
  return x.length - y.length;
}

/**
 * A number as Python's json module writes it: a safe integer as an integer ("42",
 * never "4.2e+1"), any other number as Python's repr of a float (a JavaScript number
 * past 2^53 is a float in Python as well): the shortest text that reads back the same,
 * in exponent form below 1e-4 and from 1e16 ("2.5", "1e-05", "1e+100").
 */
function number(n: number): string {
  if (Number.isSafeInteger(n)) return String(n);
  const [mantissa, exponent] = n.toExponential().split("e");
  const e = Number(exponent);
  if (e < -4 || e >= 16) return `${mantissa}e${e < 0 ? "-" : "+"}${String(Math.abs(e)).padStart(2, "0")}`;
  if (Number.isInteger(n)) return `${BigInt(n)}.0`;
  return String(n); // fixed notation, as Python's between 1e-4 and 1e16
}

function write(value: JsonValue): string {
  if (value === null) return "null";
  switch (typeof value) {
    case "boolean":
      return value ? "true" : "false";
    case "number":
      return number(value);
    case "string":
      return JSON.stringify(value); // only the escapes JSON requires, as Python's ensure_ascii=False
  }
  if (Array.isArray(value)) return `[${value.map(write).join(",")}]`;
  const object = value as { [key: string]: JsonValue };
  const keys = Object.keys(object).sort(byCodePoint);
  return `{${keys.map((k) => `${JSON.stringify(k)}:${write(object[k])}`).join(",")}}`;
}

/**
 * The canonical JSON text of `value`: keys sorted by code point, no whitespace,
 * numbers as Python writes them. A value that is not JSON throws NotJsonError.
 */
export function canonicalJson(value: unknown): string {
  return write(toPlainJson(value));
}

/** SHA-256 of the canonical JSON of `value`, as 64 lowercase hexadecimal characters. */
export function digestOf(value: unknown): string {
  return createHash("sha256").update(canonicalJson(value), "utf8").digest("hex");
}

/** The digest of a call with positional arguments `args`: that of `[args, {}]`. */
export function argsDigest(args: readonly unknown[]): string {
  return digestOf([args, {}]);
}
