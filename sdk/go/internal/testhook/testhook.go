// Package testhook lets the cyclonetest package run one claimed step through the
// worker's own code, without making that entry point part of the worker's API.
package testhook

import cyclonev1 "github.com/cyclone-workflows/cyclone/sdk/go/gen/cyclone/v1"

// RunStep runs one claimed step on worker (a *worker.Worker) as Run would: the
// handler, its step calls and the report, over the worker's connection. The worker
// package sets it.
var RunStep func(worker any, claimed *cyclonev1.ClaimedStep)
