"""The engine wing: what the server does between the API and the database. The claim
loop and its bookkeeping, completions' accounting, waits, Explain, schedule firing,
worker activity, the LISTEN dispatcher, the recovery sweep and the release loop. No
protobuf and no SQL text: it imports service.db, never service.api."""
