"""WorkerService's requests validated: who claims what, the held step a request
names, its step calls and outcomes."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from google.protobuf import duration_pb2

from cyclone import dag, flow
from cyclone.v1 import (
    types_pb2,
)
from cyclone.v1 import (
    worker_service_pb2 as worker_pb,
)
from service import errors
from service.api import convert
from service.api.ids import CANONICAL_UUID, uuid_text
from service.api.validate import (
    CHILD_FUNCTION,
    MAX_CLAIM_ACTIONS,
    MAX_ERROR_DATA,
    MAX_ERROR_TEXT,
    MAX_NODE_NAMES,
    MAX_SHARD_NODE,
    MAX_STEP_CALL_NAME,
    MAX_WORKER_ID,
    args_digest,
    check_seq,
    logs_json,
    node_name,
    seconds,
    step_call_name,
    text,
)
from service.config import Settings
from service.db.completion import StepCallEnd, StepCallKey
from service.db.records import (
    Failure,
    Outcome,
)
from service.engine.claims import Claimer
from service.engine.waits import RESERVED_PREFIX


class WorkerRequests:
    """WorkerService's request checks (a base of WorkerServicer)."""

    settings: Settings
    payloads: convert.Payloads
    node_names: set[str]

    def _lease(self, requested: duration_pb2.Duration | None) -> float:
        if requested is None:
            return self.settings.lease_s
        lease = seconds(requested)
        if not 1.0 <= lease <= self.settings.max_lease_s:
            raise errors.InvalidArgument(
                f"lease must be between 1s and {self.settings.max_lease_s:g}s, got {lease:g}s"
            )
        return lease

    def _claimer(
        self,
        worker_id: str,
        specs: Sequence[worker_pb.ActionSpec],
        lease: duration_pb2.Duration | None,
        build_id: str,
        shard_node: str,
    ) -> Claimer:
        """Who claims and what, validated (ClaimRequest's and WorkOpen's fields; the
        shard node is checked against the cluster by the claim itself)."""
        if build_id:
            dag.check_build_id(build_id)
        shard_node = text(shard_node, "shard_node", MAX_SHARD_NODE)
        worker_id = text(worker_id, "worker_id", MAX_WORKER_ID)
        if not worker_id:
            raise errors.InvalidArgument("worker_id is required")
        if not specs:
            raise errors.InvalidArgument("actions must name at least one action")
        if len(specs) > MAX_CLAIM_ACTIONS:
            raise errors.InvalidArgument(
                f"actions names {len(specs)} actions; the limit is {MAX_CLAIM_ACTIONS}"
            )
        actions, unsafe = [], []
        rates: dict[str, tuple[int, float]] = {}
        for spec in specs:
            dag.check_name("action", spec.name)
            if spec.name.startswith(RESERVED_PREFIX):
                raise errors.InvalidArgument(
                    f"action {spec.name!r}: names starting with {RESERVED_PREFIX!r} are "
                    "served by the server itself"
                )
            actions.append(spec.name)
            if spec.unsafe_to_repeat:
                unsafe.append(spec.name)
            if spec.HasField("rate_limit"):
                period = (
                    seconds(spec.rate_limit.period) if spec.rate_limit.HasField("period") else 0.0
                )
                where = f"action {spec.name!r}"
                flow.check_rate_limit(where, spec.rate_limit.count, period)
                # The first declaration of an action counts, as for the rest of its spec.
                rates.setdefault(spec.name, (spec.rate_limit.count, period))
        return Claimer(
            worker_id,
            actions,
            unsafe,
            rates,
            self._lease(lease),
            build_id or None,
            shard_node or None,
        )

    def _step_key(
        self,
        request: worker_pb.HeartbeatRequest
        | worker_pb.CompleteRequest
        | worker_pb.BeginStepCallRequest
        | worker_pb.EndStepCallRequest
        | worker_pb.StartChildRequest
        | worker_pb.WaitRequest,
    ) -> tuple[str, str, str]:
        """The held step a request names: its run and lease token as canonical text."""
        return (
            uuid_text(request.run_id),
            node_name(request.node),
            uuid_text(request.lease_token, "lease_token"),
        )

    def _step_call(
        self,
        request: worker_pb.BeginStepCallRequest
        | worker_pb.EndStepCallRequest
        | worker_pb.StartChildRequest,
    ) -> StepCallKey:
        """A validated step call of a held step (a child's start: function
        cyclone.start_child)."""
        run_id, node, token = self._step_key(request)
        check_seq(request.seq)
        if isinstance(request, worker_pb.StartChildRequest):
            function, unsafe, digest = CHILD_FUNCTION, False, ""
        else:
            function = step_call_name(request.function, "function")
            unsafe = request.unsafe_to_repeat
            digest = args_digest(request.args_digest)
        return StepCallKey(
            run_id=run_id,
            node=node,
            lease_token=token,
            step_id=step_call_name(request.step_id, "step_id"),
            seq=request.seq,
            function=function,
            unsafe=unsafe,
            args_digest=digest,
        )

    def _step_call_end(self, request: worker_pb.EndStepCallRequest) -> StepCallEnd:
        """A validated step call end: the call's key and its output or error."""
        call = self._step_call(request)
        outcome = request.WhichOneof("outcome")
        if outcome == "output":
            output = self.payloads.to_json(request.output, "output")
            return StepCallEnd(call, output_json=output, error_json=None)
        if outcome == "error":
            error = json.dumps(self._step_call_error(request.error), ensure_ascii=False)
            return StepCallEnd(call, output_json=None, error_json=error)
        raise errors.InvalidArgument("outcome is required: set output or error")

    def _step_call_error(self, e: types_pb2.StepCallError) -> dict[str, Any]:
        """A step call's error as step_calls.error keeps it: module, args and attributes
        only when the worker set them, so an error without them keeps its old shape."""
        error: dict[str, Any] = {
            "type": text(e.type, "error.type", MAX_STEP_CALL_NAME),
            "message": text(e.message, "error.message", MAX_ERROR_TEXT),
            "details": text(e.details, "error.details", MAX_ERROR_TEXT),
        }
        if e.module:
            error["module"] = text(e.module, "error.module", MAX_STEP_CALL_NAME)
        data: dict[str, Any] = {}
        for field, kind in (("args", list), ("attributes", dict)):
            if e.HasField(field):
                value = self.payloads.to_python(getattr(e, field), f"error.{field}")
                if not isinstance(value, kind):
                    shape = "a list" if kind is list else "an object"
                    raise errors.InvalidArgument(f"error.{field} must be {shape} of JSON values")
                data[field] = value
        size = len(json.dumps(data, separators=(",", ":"), ensure_ascii=False))
        if size > MAX_ERROR_DATA:
            raise errors.InvalidArgument(
                f"error.args and error.attributes are {size} characters of JSON together; "
                f"the limit is {MAX_ERROR_DATA}: leave the largest attributes out"
            )
        return error | data

    def _completion(self, request: worker_pb.CompleteRequest) -> Outcome:
        """A validated outcome: the step's key plus its output or failure."""
        run_id, node, token = request.run_id, request.node, request.lease_token
        # What workers send back is canonical UUID text and a node name seen before:
        # one regex match per id and a set lookup; anything else takes the full checks
        # (and their errors).
        if (
            CANONICAL_UUID.fullmatch(run_id) is None
            or CANONICAL_UUID.fullmatch(token) is None
            or node not in self.node_names
        ):
            run_id, node, token = self._step_key(request)
            if len(self.node_names) < MAX_NODE_NAMES:
                self.node_names.add(node)
        outcome = request.WhichOneof("outcome")
        if outcome == "output":
            output = self.payloads.to_json(request.output, "output")
            logs = logs_json(request) if request.logs else None
            return Outcome(run_id, node, token, output_json=output, logs_json=logs)
        if outcome == "failure":
            f = request.failure
            retry_after = seconds(f.retry_after) if f.HasField("retry_after") else None
            if retry_after is not None and not 0 <= retry_after <= dag.MAX_BACKOFF_S:
                raise errors.InvalidArgument(
                    f"retry_after must be between 0s and {dag.MAX_BACKOFF_S:g}s"
                )
            failure = Failure(
                type=text(f.type, "failure.type", 200),
                message=text(f.message, "failure.message", MAX_ERROR_TEXT),
                details=text(f.details, "failure.details", MAX_ERROR_TEXT),
                retryable=not f.non_retryable,
                retry_after_s=retry_after,
                uncertain=f.effect_uncertain,
            )
            return Outcome(run_id, node, token, failure=failure, logs_json=logs_json(request))
        raise errors.InvalidArgument("outcome is required: set output or failure")
