"""WorkerService.Work: a worker's session on one stream. Steps handed out within the
credit, pushed when they become ready, reports answered in order as CompleteMany
answers them, bad requests refused with a status that ends the stream, leases kept
however the stream ends."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Iterator
from typing import Any

import grpc
import pytest

from cyclone.v1 import types_pb2, worker_service_pb2_grpc
from cyclone.v1 import worker_service_pb2 as pb
from tests.helpers import (
    claim,
    complete,
    get_run,
    node,
    run_status,
    seconds,
    statuses,
    submit,
    value,
    workflow,
)


class Stream:
    """One Work stream through the test's channel: requests sent from a queue, each
    response read with a bound on the wait."""

    def __init__(
        self,
        server: Any,
        first: pb.WorkRequest | bytes,
        channel: grpc.Channel | None = None,
        **kwargs: Any,
    ) -> None:
        self._requests: queue.Queue[Any] = queue.Queue()
        self._requests.put(first)
        channel = channel or server.channel
        if isinstance(first, bytes):
            # Raw bytes, to send what no protobuf library would write.
            method = channel.stream_stream(
                "/cyclone.v1.WorkerService/Work",
                request_serializer=lambda b: b,
                response_deserializer=pb.WorkResponse.FromString,
            )
            self.call = method(iter(self._requests.get, None), timeout=30, **kwargs)
        else:
            work = worker_service_pb2_grpc.WorkerServiceStub(channel).Work
            self.call = work(iter(self._requests.get, None), timeout=30, **kwargs)
        self._responses: queue.Queue[Any] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        try:
            for response in self.call:
                self._responses.put(response)
        except grpc.RpcError as exc:
            self._responses.put(exc)
        self._responses.put(None)  # the end of the stream

    def send(self, request: pb.WorkRequest | bytes) -> None:
        self._requests.put(request)

    def close(self) -> None:
        """Half-close: the worker sends no more."""
        self._requests.put(None)

    def next(self, timeout: float = 20) -> Any:
        """The next response; None at the stream's end (raises its error status)."""
        response = self._responses.get(timeout=timeout)
        if isinstance(response, grpc.RpcError):
            raise response
        return response

    def quiet(self, for_s: float = 0.5) -> bool:
        """Whether nothing arrives for ``for_s`` seconds."""
        try:
            self._responses.put(self._responses.get(timeout=for_s))
        except queue.Empty:
            return True
        return False

    def steps(self, n: int) -> list[pb.ClaimedStep]:
        """Read responses until ``n`` steps have come (failing on a report answer)."""
        got: list[pb.ClaimedStep] = []
        while len(got) < n:
            response = self.next()
            assert response is not None, f"the stream ended after {len(got)} of {n} steps"
            assert not response.HasField("report")
            got.extend(response.steps)
        return got


def opening(
    credit: int, *actions: str, unsafe: tuple[str, ...] = (), lease: float | None = None
) -> pb.WorkRequest:
    request = pb.WorkRequest(
        open=pb.WorkOpen(
            worker_id="stream-worker",
            actions=[pb.ActionSpec(name=a, unsafe_to_repeat=a in unsafe) for a in actions],
        ),
        credit=credit,
    )
    if lease is not None:
        request.open.lease.CopyFrom(seconds(lease))
    return request


def report(*steps: pb.ClaimedStep, credit: int = 0, output: Any = None) -> pb.WorkRequest:
    request = pb.WorkRequest(credit=credit)
    for step in steps:
        request.report.completions.add(
            run_id=step.run_id, node=step.node, lease_token=step.lease_token, output=value(output)
        )
    return request


def one_node_runs(server: Any, n: int, action: str = "work") -> list[str]:
    return [submit(server, workflow("w", node("only", action))) for _ in range(n)]


def status_code(stream: Stream) -> grpc.StatusCode:
    with pytest.raises(grpc.RpcError) as info:
        while stream.next() is not None:
            pass
    return info.value.code()


@pytest.fixture
def server(cyclone_server: Any) -> Iterator[Any]:
    yield cyclone_server


def test_steps_are_handed_out_within_the_credit_and_more_as_it_is_granted(server: Any) -> None:
    runs = one_node_runs(server, 5)
    stream = Stream(server, opening(2, "work"))
    first = stream.steps(2)
    assert stream.quiet(), "more steps than the credit"
    assert {s.attempt for s in first} == {1}
    stream.send(pb.WorkRequest(credit=3))
    rest = stream.steps(3)
    assert {s.run_id for s in first + rest} == set(runs)
    held = server.sql("SELECT count(*) FROM cyclone.steps WHERE status = 'running'")[0][0]
    assert held == 5
    stream.close()
    assert stream.next() is None


def test_an_idle_stream_is_handed_a_step_as_soon_as_one_is_ready(server: Any) -> None:
    stream = Stream(server, opening(4, "work"))
    assert stream.quiet(0.3)
    run_id = submit(server, workflow("w", node("only")))
    [step] = stream.steps(1)
    assert step.run_id == run_id and step.node == "only"
    stream.close()


def test_a_report_is_answered_in_order_with_the_next_steps_and_commits_its_outcomes(
    server: Any,
) -> None:
    one_node_runs(server, 4)
    stream = Stream(server, opening(2, "work"))
    first = stream.steps(2)
    stream.send(report(*first, credit=2, output={"ok": 1}))
    answer = stream.next()
    assert answer.HasField("report")
    assert [r.response.status for r in answer.report.results] == [
        types_pb2.STEP_STATUS_COMPLETED
    ] * 2
    assert {r.response.run_status for r in answer.report.results} == {
        types_pb2.RUN_STATUS_COMPLETED
    }
    # The credit the report granted came back with its answer.
    second = list(answer.steps)
    assert len(second) == 2 and not {s.run_id for s in second} & {s.run_id for s in first}
    for step in first:
        run = get_run(server, step.run_id)
        assert run_status(run) == "completed" and statuses(run) == {"only": "completed"}
    # Two reports sent back to back are answered one each, in the order sent.
    stream.send(report(second[0]))
    stream.send(report(second[1], second[0]))
    one, two = stream.next(), stream.next()
    assert len(one.report.results) == 1 and not one.report.results[0].response.duplicate
    assert [r.response.duplicate for r in two.report.results] == [False, True]
    stream.close()
    assert stream.next() is None


def test_a_stream_s_time_is_counted_by_phase(server: Any) -> None:
    registry = server.server.metrics.registry

    def seconds_in() -> dict[str, float]:
        return {
            phase: registry.get_sample_value("cyclone_work_stream_seconds_total", {"phase": phase})
            or 0.0
            for phase in ("report", "claim", "worker", "idle")
        }

    before = seconds_in()
    one_node_runs(server, 1)
    stream = Stream(server, opening(1, "work"))
    [step] = stream.steps(1)
    time.sleep(0.3)  # its one slot is in use: the stream waits on its worker
    stream.send(report(step, credit=1))
    assert stream.next().HasField("report")
    time.sleep(0.3)  # credit left and nothing ready: the stream is idle
    stream.close()
    assert stream.next() is None
    spent = {phase: s - before[phase] for phase, s in seconds_in().items()}
    assert spent["worker"] >= 0.25 and spent["idle"] >= 0.25, spent
    assert spent["report"] > 0 and spent["claim"] > 0, spent


def test_a_stale_lease_in_a_report_is_refused_alone(server: Any) -> None:
    [run_a, run_b] = one_node_runs(server, 2)
    stream = Stream(server, opening(2, "work"))
    a, b = sorted(stream.steps(2), key=lambda s: s.run_id == run_b)
    stale = pb.ClaimedStep()
    stale.CopyFrom(a)
    stale.lease_token = "00000000-0000-4000-8000-000000000000"
    stream.send(report(stale, b))
    answer = stream.next()
    refused, applied = answer.report.results
    assert refused.error.code == grpc.StatusCode.ABORTED.value[0]
    assert applied.response.status == types_pb2.STEP_STATUS_COMPLETED
    assert statuses(get_run(server, run_a)) == {"only": "running"}
    assert run_status(get_run(server, run_b)) == "completed"
    stream.close()


def test_steps_keep_their_leases_when_the_stream_ends(server: Any) -> None:
    [run_id] = one_node_runs(server, 1)
    stream = Stream(server, opening(1, "work"))
    [step] = stream.steps(1)
    stream.close()
    assert stream.next() is None
    assert statuses(get_run(server, run_id)) == {"only": "running"}
    # Completed with a plain call after its stream ended.
    assert complete(server, step).status == types_pb2.STEP_STATUS_COMPLETED
    assert run_status(get_run(server, run_id)) == "completed"


def test_a_cancelled_stream_hands_back_nothing_it_already_sent(server: Any) -> None:
    one_node_runs(server, 2)
    stream = Stream(server, opening(1, "work"))
    [step] = stream.steps(1)
    stream.call.cancel()
    # The step it had is still leased to it; the other is still claimable.
    others = claim(server, n=5)
    assert len(others) == 1 and others[0].run_id != step.run_id
    assert server.sql("SELECT status FROM cyclone.steps WHERE run_id = %s", step.run_id) == [
        ("running",)
    ]


@pytest.mark.parametrize(
    ("requests", "message"),
    [
        ([pb.WorkRequest(credit=1)], "the first message of a Work stream must set open"),
        ([opening(1001, "work")], "credit must be between 0 and 1000, got 1001"),
        ([opening(-1, "work")], "credit must be between 0 and 1000, got -1"),
        ([opening(1)], "actions must name at least one action"),
        ([opening(1, "bad name!")], "action"),
        ([opening(1, "work"), opening(1, "work")], "open may be set only in the first message"),
        ([opening(0, "work")] + [pb.WorkRequest(credit=1000)] * 11, "the limit is 10000"),
        ([opening(0, "work"), pb.WorkRequest(report=pb.CompleteManyRequest())], "at least one"),
        (
            [
                opening(0, "work"),
                pb.WorkRequest(
                    report=pb.CompleteManyRequest(
                        completions=[pb.CompleteRequest(run_id="nope", node="n", lease_token="t")]
                    )
                ),
            ],
            "completions[0]",
        ),
    ],
)
def test_a_bad_request_ends_the_stream_with_invalid_argument_and_writes_nothing(
    server: Any, requests: list[pb.WorkRequest], message: str
) -> None:
    one_node_runs(server, 1)
    stream = Stream(server, requests[0])
    for request in requests[1:]:
        stream.send(request)
    with pytest.raises(grpc.RpcError) as info:
        while (response := stream.next()) is not None:
            assert not response.HasField("report")
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert message in info.value.details()
    assert server.sql("SELECT count(*) FROM cyclone.steps WHERE status = 'completed'") == [(0,)]


def test_bytes_that_are_not_a_work_request_are_invalid_argument(server: Any) -> None:
    stream = Stream(server, b"\xff\xff\xff")
    with pytest.raises(grpc.RpcError) as info:
        stream.next()
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "not a valid Work request message" in info.value.details()


def test_a_stopping_server_answers_what_it_read_then_ends_the_stream(
    server_factory: Any,
) -> None:
    server = server_factory(grace_s=5)
    one_node_runs(server, 1)
    # A channel of its own: stopping the test server closes the server's.
    stream = Stream(server, opening(1, "work"), grpc.insecure_channel(server.address))
    [step] = stream.steps(1)
    stream.send(report(step, credit=1))
    answer = stream.next()
    assert answer.report.results[0].response.status == types_pb2.STEP_STATUS_COMPLETED
    stopping = threading.Thread(target=server.stop, kwargs={"grace": 5})
    stopping.start()
    assert stream.next() is None  # ended with OK, not cut off
    stopping.join(30)
    assert stream.call.code() == grpc.StatusCode.OK


def test_an_unsafe_action_s_uncertain_step_blocks_its_run_and_is_said(server: Any) -> None:
    [run_id] = one_node_runs(server, 1, action="charge")
    [step] = claim(server, "charge", unsafe=("charge",), lease=1)
    server.advance_clock(5)
    assert server.sweep() == 1
    stream = Stream(server, opening(1, "charge", unsafe=("charge",)))
    response = stream.next()
    assert not response.steps
    [blocked] = response.blocked
    assert (blocked.run_id, blocked.node, blocked.attempt) == (run_id, "only", step.attempt)
    assert "EffectUncertain" in blocked.reason or "lost its lease" in blocked.reason
    assert run_status(get_run(server, run_id)) == "blocked"
    stream.close()


def test_the_lease_asked_for_at_open_is_the_lease_of_every_step(server: Any) -> None:
    one_node_runs(server, 1)
    stream = Stream(server, opening(1, "work", lease=7))
    [step] = stream.steps(1)
    [(lease_s,)] = server.sql(
        "SELECT extract(epoch FROM lease_expires_at - started_at) FROM cyclone.steps"
    )
    assert float(lease_s) == pytest.approx(7, abs=0.01)
    assert step.lease_expires_at.seconds > 0
    stream.close()
