// A worker of the TypeScript SDK with an OpenTelemetry tracer provider registered, for
// tests/test_sdk_ts_tracing.py: each span it ends is printed as one JSON line
// (prefixed "span "), with its trace id, span id, parent span id, name, kind, status
// and attributes.
//
//   node tests/ts_traced_worker.mjs ADDRESS

import { createRequire } from "node:module";

import { Worker } from "../sdk/ts/dist/src/index.js";

// The tracing packages come from the SDK's own install (its dev dependencies).
const require = createRequire(new URL("../sdk/ts/package.json", import.meta.url));
const api = require("@opentelemetry/api");
const { AsyncLocalStorageContextManager } = require("@opentelemetry/context-async-hooks");
const { BasicTracerProvider, SimpleSpanProcessor } = require("@opentelemetry/sdk-trace-base");

const printer = {
  export(spans, done) {
    for (const s of spans) {
      const context = s.spanContext();
      const line = {
        trace_id: context.traceId,
        span_id: context.spanId,
        parent_span_id: s.parentSpanContext?.spanId ?? s.parentSpanId ?? null,
        name: s.name,
        kind: s.kind,
        status: s.status.code,
        events: s.events.map((e) => e.name),
        attributes: s.attributes,
      };
      process.stdout.write(`span ${JSON.stringify(line)}\n`);
    }
    done({ code: 0 });
  },
  shutdown: async () => {},
};
api.context.setGlobalContextManager(new AsyncLocalStorageContextManager().enable());
api.trace.setGlobalTracerProvider(new BasicTracerProvider({ spanProcessors: [new SimpleSpanProcessor(printer)] }));

const [address] = process.argv.slice(2);

async function charge(ctx) {
  const tracer = api.trace.getTracer("shop");
  return tracer.startActiveSpan("charge card", async (span) => {
    await new Promise((resolve) => setTimeout(resolve, 10));
    span.end();
    return { charged: ctx.runInput.amount };
  });
}

function decline() {
  throw new Error("card declined");
}

const worker = new Worker({ address, claimWaitMs: 2000, actions: { "ts.charge": charge, "ts.decline": decline } });
await worker.run({ handleSignals: true });
