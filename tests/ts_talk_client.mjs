// The TypeScript SDK's client calls to running work, for tests/test_sdk_ts_talk.py, in
// plain JavaScript on the SDK's build (sdk/ts/dist). Each command prints one JSON line
// per result; a failed call prints {"error": CODE_NAME, "message": ...} and exits 3.
//
//   node tests/ts_talk_client.mjs ADDRESS stream RUN STREAM [FROM_OFFSET] [--no-wait]
//   node tests/ts_talk_client.mjs ADDRESS streams RUN
//   node tests/ts_talk_client.mjs ADDRESS query RUN NODE NAME [ARGS_JSON]
//   node tests/ts_talk_client.mjs ADDRESS update RUN NODE NAME [ARGS_JSON] [UPDATE_ID]
//   node tests/ts_talk_client.mjs ADDRESS approvals [RUN] [--all]
//   node tests/ts_talk_client.mjs ADDRESS decide APPROVAL_ID yes|no [COMMENT]

import { Client, Code, ConnectError } from "../sdk/ts/dist/src/index.js";

const [address, command, ...rest] = process.argv.slice(2);
const client = new Client({ address, actor: "ts-client" });
const print = (value) => process.stdout.write(`${JSON.stringify(value)}\n`);

try {
  switch (command) {
    case "stream": {
      const [runId, stream, from] = rest;
      const noWait = rest.includes("--no-wait");
      for await (const chunk of client.readStream(runId, stream, { fromOffset: Number(from ?? 0), noWait })) print(chunk);
      print({ end: true });
      break;
    }
    case "streams":
      print(await client.listStreams(rest[0]));
      break;
    case "query":
      print(await client.query(rest[0], rest[1], rest[2], JSON.parse(rest[3] ?? "[]")));
      break;
    case "update":
      print(await client.update(rest[0], rest[1], rest[2], JSON.parse(rest[3] ?? "[]"), { updateId: rest[4] }));
      break;
    case "approvals":
      print(await client.listApprovals({ runId: rest[0] === "--all" ? undefined : rest[0], all: rest.includes("--all") }));
      break;
    case "decide":
      print(await client.decideApproval(rest[0], rest[1] === "yes", rest[2] ?? ""));
      break;
    default:
      throw new Error(`unknown command ${command}`);
  }
} catch (error) {
  if (!(error instanceof ConnectError)) throw error;
  print({ error: Code[error.code], message: error.rawMessage });
  process.exitCode = 3;
}
