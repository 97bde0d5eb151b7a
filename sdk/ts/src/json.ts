// JSON payloads: every input, output and step result travels as a
// google.protobuf.Value. Values are checked here, before anything is sent, so that a
// value JSON cannot carry (a BigInt, a cycle, NaN, a Map) is an error naming where it
// is, never a value silently changed or a request refused for a reason nobody sees.

import { fromJson, toBinary, toJson, type JsonValue } from "@bufbuild/protobuf";
import { ValueSchema, type Value } from "@bufbuild/protobuf/wkt";

export type { JsonValue };

/** A value JSON cannot carry, with the path where it was found ("$.items[2].price"). */
export class NotJsonError extends TypeError {
  override name = "NotJsonError";
  constructor(
    readonly path: string,
    readonly reason: string,
  ) {
    super(`${reason} at ${path}: JSON cannot carry it`);
  }
}

/**
 * `value` as plain JSON, as JSON.stringify would write it (toJSON is honoured, so a
 * Date becomes its ISO string; object properties that are undefined or functions are
 * left out), except that what JSON.stringify would silently change or cannot write is
 * an error: a BigInt, a cycle, NaN or an infinity, a Map or a Set, a symbol or
 * function in place of a value. `undefined` at the top is null (a handler that
 * returns nothing).
 */
export function toPlainJson(value: unknown): JsonValue {
  return plain(value, "$", "", new Set<object>());
}

function plain(value: unknown, path: string, key: string, seen: Set<object>): JsonValue {
  if (value !== null && typeof value === "object" && typeof (value as { toJSON?: unknown }).toJSON === "function") {
    value = (value as { toJSON(key: string): unknown }).toJSON(key);
  }
  switch (typeof value) {
    case "string":
    case "boolean":
      return value;
    case "number":
      if (!Number.isFinite(value)) throw new NotJsonError(path, `the number ${value}`);
      return value;
    case "bigint":
      throw new NotJsonError(path, `a BigInt (${value}n); convert it to a number or a string`);
    case "undefined":
      if (path === "$") return null;
      throw new NotJsonError(path, "undefined");
    case "symbol":
      throw new NotJsonError(path, "a symbol");
    case "function":
      throw new NotJsonError(path, "a function");
  }
  if (value === null) return null;
  const object = value as object;
  if (object instanceof Map || object instanceof Set || object instanceof WeakMap || object instanceof WeakSet) {
    throw new NotJsonError(path, `a ${object.constructor.name}; convert it to an object or an array`);
  }
  if (ArrayBuffer.isView(object) || object instanceof ArrayBuffer) {
    throw new NotJsonError(path, "binary data; encode it (base64) or store it elsewhere");
  }
  if (seen.has(object)) throw new NotJsonError(path, "a cycle (an object that contains itself)");
  seen.add(object);
  try {
    if (Array.isArray(object)) {
      return object.map((item: unknown, i) => plain(item, `${path}[${i}]`, String(i), seen));
    }
    const out: { [key: string]: JsonValue } = {};
    for (const [k, v] of Object.entries(object)) {
      if (v === undefined || typeof v === "function") continue; // as JSON.stringify does
      out[k] = plain(v, /^[A-Za-z_$][\w$]*$/.test(k) ? `${path}.${k}` : `${path}[${JSON.stringify(k)}]`, k, seen);
    }
    return out;
  } finally {
    seen.delete(object);
  }
}

/** `value` (checked by toPlainJson) as a google.protobuf.Value. */
export function toValue(value: unknown): Value {
  return fromJson(ValueSchema, toPlainJson(value));
}

/** A Value as plain JSON; an absent one is null. */
export function fromValue(value: Value | undefined): JsonValue {
  return value === undefined ? null : toJson(ValueSchema, value);
}

/** The size the server measures a payload by: its protobuf encoding, in bytes. */
export function valueSize(value: Value): number {
  return toBinary(ValueSchema, value).length;
}
