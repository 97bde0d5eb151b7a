// Query and update handlers of a durable function (docs/durable-functions.md, "Queries
// and updates"). A body registers them while it runs, as closures over its own state:
//
//   const items: string[] = [];
//   ctx.query("items", () => items);
//   ctx.update("add_item", (item: string) => items.push(item));
//
// A query handler reads (the worker calls it between the body's awaits: keep it quick
// and read-only). An update handler changes the state: the body runs it at a journal
// point (a step call returning, a wait), and the journal records it there (step id
// "update:<id>", function "cyclone.update") with its arguments and result, so that a
// replay runs it again at the same point, before the body's code after it.

import { badName, MAX_NAME } from "./errors.js";
import { toPlainJson, type JsonValue } from "./json.js";

/** The journal's function of an update's application, and its step ids' prefix. */
export const UPDATE_FUNCTION = "cyclone.update";
export const UPDATE_PREFIX = "update:";

// eslint-disable-next-line @typescript-eslint/no-explicit-any
export type MessageHandler = (...args: any[]) => unknown;

/** An update the server handed to the worker running the body. */
export interface DeliveredUpdate {
  updateId: string;
  name: string;
  args: JsonValue[];
}

/** What a handler's failure is to its asker: its type and message. */
export interface HandlerError {
  type: string;
  message: string;
}

/** What the journal records of an update's application. */
export type AppliedUpdate = { update: string; args: JsonValue[]; result?: JsonValue; error?: { type: string; message: string } };

function errorOf(error: unknown): HandlerError {
  if (error instanceof Error) {
    const type = (error as { type?: unknown }).type;
    return { type: typeof type === "string" && type ? type : error.name || "Error", message: error.message };
  }
  return { type: "thrown", message: String(error) };
}

function isThenable(value: unknown): boolean {
  return value !== null && (typeof value === "object" || typeof value === "function") && typeof (value as { then?: unknown }).then === "function";
}

/** A handler's value as JSON; a Promise or what JSON cannot carry throws. */
function jsonResult(kind: string, name: string, value: unknown): JsonValue {
  if (isThenable(value)) throw new TypeError(`${kind} handler "${name}" returned a Promise: it must answer synchronously`);
  return toPlainJson(value);
}

/**
 * The query and update handlers one attempt of a body registered, the updates
 * delivered to it and not yet applied, and what it last published.
 */
export class BodyHandlers {
  readonly queries = new Map<string, MessageHandler>();
  readonly updates = new Map<string, MessageHandler>();
  private readonly publishable = new Set<string>();
  private delivered: DeliveredUpdate[] = [];
  private readonly last = new Map<string, string>();
  /**
   * Set by the worker: called with the changed values of the queries that take no
   * arguments, by name, at each journal point and when the body ends.
   */
  onPublish: ((values: Map<string, JsonValue>) => void) | undefined;
  /** Set by the worker: called once, when the body registers its first handler. */
  onRegister: (() => void) | undefined;

  // -- registration (from the body)

  query(name: string, fn: MessageHandler): void {
    this.check("query", name, fn);
    this.queries.set(name, fn);
    if (fn.length === 0) this.publishable.add(name);
    else this.publishable.delete(name);
    this.registered();
  }

  update(name: string, fn: MessageHandler): void {
    this.check("update", name, fn);
    if (fn.constructor.name === "AsyncFunction") throw new TypeError(`update handler "${name}" must be a plain function, not async`);
    this.updates.set(name, fn);
    this.registered();
  }

  private check(kind: string, name: string, fn: MessageHandler): void {
    const problem = badName(`${kind} handler's name`, name, MAX_NAME);
    if (problem) throw new TypeError(problem);
    if (typeof fn !== "function") throw new TypeError(`a ${kind} handler is a function, got ${typeof fn}`);
  }

  private registered(): void {
    const told = this.onRegister;
    this.onRegister = undefined;
    told?.();
  }

  // -- queries (from the worker)

  /** A query's answer: its value, or the error its asker gets. */
  answer(name: string, args: readonly JsonValue[]): { value: JsonValue } | { error: HandlerError } {
    const handler = this.queries.get(name);
    if (handler === undefined) {
      const known = [...this.queries.keys()].sort().join(", ") || "none";
      return { error: { type: "UnknownQuery", message: `the body has no query handler "${name}" (it has: ${known})` } };
    }
    try {
      return { value: jsonResult("query", name, handler(...args)) };
    } catch (error) {
      return { error: errorOf(error) };
    }
  }

  // -- updates

  get pending(): boolean {
    return this.delivered.length > 0;
  }

  /** From the worker: an update for the body's next journal point (once per id). */
  deliver(update: DeliveredUpdate): void {
    if (this.delivered.every((d) => d.updateId !== update.updateId)) this.delivered.push(update);
  }

  take(): DeliveredUpdate[] {
    const taken = this.delivered;
    this.delivered = [];
    return taken;
  }

  /** Runs an update's handler: what the journal records of it. */
  apply(update: DeliveredUpdate): AppliedUpdate {
    const recorded: AppliedUpdate = { update: update.name, args: [...update.args] };
    const handler = this.updates.get(update.name);
    if (handler === undefined) {
      const known = [...this.updates.keys()].sort().join(", ") || "none";
      recorded.error = { type: "UnknownUpdate", message: `the body has no update handler "${update.name}" (it has: ${known})` };
      return recorded;
    }
    try {
      recorded.result = jsonResult("update", update.name, handler(...update.args));
    } catch (error) {
      recorded.error = errorOf(error);
    }
    return recorded;
  }

  /**
   * A replay meets an update's journal entry: its handler runs again with the recorded
   * arguments (the state as it was); its result is the recorded one. Whether it ran,
   * or why not.
   */
  reapply(recorded: JsonValue): string | undefined {
    if (recorded === null || typeof recorded !== "object" || Array.isArray(recorded) || "error" in recorded) return undefined;
    const name = recorded.update;
    const handler = typeof name === "string" ? this.updates.get(name) : undefined;
    if (handler === undefined) return `the body has no update handler ${JSON.stringify(name)} now`;
    const args = Array.isArray(recorded.args) ? recorded.args : [];
    try {
      handler(...args);
    } catch (error) {
      return `update handler "${String(name)}" threw on replay: ${errorOf(error).message}`;
    }
    return undefined;
  }

  // -- publication (from the body, at its journal points)

  /** Hands the worker the values of the argument-less queries that changed since the last publication. */
  publish(): void {
    const publish = this.onPublish;
    if (publish === undefined || this.publishable.size === 0) return;
    const changed = new Map<string, JsonValue>();
    for (const name of [...this.publishable].sort()) {
      let value: JsonValue;
      try {
        value = jsonResult("query", name, this.queries.get(name)?.());
      } catch {
        continue; // not publishable now: the last value stays
      }
      const text = JSON.stringify(value);
      if (this.last.get(name) !== text) {
        this.last.set(name, text);
        changed.set(name, value);
      }
    }
    if (changed.size > 0) publish(changed);
  }
}
