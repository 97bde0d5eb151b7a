"""AdminService's build RPCs: list builds and their runs, declare a build compatible
with another, retire a build, move a retired build's nodes (docs/durable-functions.md,
"Build pinning")."""

from __future__ import annotations

import logging

from cyclone import dag
from cyclone.v1 import admin_service_pb2 as admin_pb
from service import errors
from service.api import convert
from service.api.status import rpc
from service.api.validate import MAX_REASON, Context, actor_of, text
from service.db import Database
from service.db.builds import BuildRow

log = logging.getLogger("cyclone")

#: ListBuildRuns' page: its default and its limit.
DEFAULT_BUILD_RUNS = 100
MAX_BUILD_RUNS = 1000


def build_id_of(value: str, what: str = "build_id") -> str:
    """A build id from a request: INVALID_ARGUMENT unless 1-200 printable characters."""
    if not value:
        raise errors.InvalidArgument(f"{what} is required")
    try:
        dag.check_build_id(value)
    except dag.InvalidWorkflow as e:
        raise errors.InvalidArgument(f"{what}: {e}") from None
    return value


def build_proto(row: BuildRow) -> admin_pb.Build:
    return admin_pb.Build(
        build_id=row.build_id,
        compatible=row.compatible,
        workers=[
            admin_pb.BuildWorker(worker_id=w["worker_id"], seen_at=convert.timestamp(w["seen_at"]))
            for w in row.workers
        ],
        pinned_nodes=row.pinned_nodes,
        pinned_runs=row.pinned_runs,
        retired=row.retired_at is not None,
        retired_at=convert.timestamp(row.retired_at),
        created_at=convert.timestamp(row.created_at),
    )


class BuildsAdmin:
    """The build RPCs of AdminServicer."""

    db: Database

    async def _build(self, build_id: str) -> admin_pb.Build:
        [row] = await self.db.builds.builds_list(build_id)
        return build_proto(row)

    @rpc
    async def ListBuilds(
        self, request: admin_pb.ListBuildsRequest, context: Context
    ) -> admin_pb.ListBuildsResponse:
        rows = await self.db.builds.builds_list()
        return admin_pb.ListBuildsResponse(builds=[build_proto(r) for r in rows])

    @rpc
    async def ListBuildRuns(
        self, request: admin_pb.ListBuildRunsRequest, context: Context
    ) -> admin_pb.ListBuildRunsResponse:
        build_id = build_id_of(request.build_id)
        limit = request.limit or DEFAULT_BUILD_RUNS
        if not 1 <= limit <= MAX_BUILD_RUNS:
            raise errors.InvalidArgument(
                f"limit must be between 1 and {MAX_BUILD_RUNS}, got {limit}"
            )
        if not await self.db.builds.builds_list(build_id):
            raise errors.NotFound(f"unknown build {build_id}: no worker declared it")
        rows = await self.db.builds.build_runs(build_id, limit)
        return admin_pb.ListBuildRunsResponse(
            runs=[
                admin_pb.BuildRun(run_id=r.run_id, workflow=r.workflow, nodes=r.nodes) for r in rows
            ]
        )

    @rpc
    async def SetBuildCompatible(
        self, request: admin_pb.SetBuildCompatibleRequest, context: Context
    ) -> admin_pb.SetBuildCompatibleResponse:
        build_id = build_id_of(request.build_id)
        with_id = build_id_of(request.compatible_with, "compatible_with")
        reason = text(request.reason, "reason", MAX_REASON)
        await self.db.builds.build_compatible(build_id, with_id)
        log.warning(
            "build %s declared compatible with build %s by %s (%s)",
            build_id,
            with_id,
            actor_of(context),
            reason or "no reason given",
        )
        return admin_pb.SetBuildCompatibleResponse(build=await self._build(build_id))

    @rpc
    async def RetireBuild(
        self, request: admin_pb.RetireBuildRequest, context: Context
    ) -> admin_pb.RetireBuildResponse:
        build_id = build_id_of(request.build_id)
        reason = text(request.reason, "reason", MAX_REASON)
        await self.db.builds.build_retire(build_id)
        log.warning(
            "build %s retired by %s (%s)", build_id, actor_of(context), reason or "no reason given"
        )
        return admin_pb.RetireBuildResponse(build=await self._build(build_id))

    @rpc
    async def MoveBuild(
        self, request: admin_pb.MoveBuildRequest, context: Context
    ) -> admin_pb.MoveBuildResponse:
        from_id = build_id_of(request.from_build_id, "from_build_id")
        to_id = build_id_of(request.to_build_id, "to_build_id")
        reason = text(request.reason, "reason", MAX_REASON)
        moved = await self.db.builds.build_move(
            from_id, to_id, actor=actor_of(context), reason=reason
        )
        log.warning(
            "build %s: %d unfinished node(s) of %d run(s) moved to build %s by %s (%s)",
            from_id,
            moved.nodes,
            moved.runs,
            to_id,
            actor_of(context),
            reason or "no reason given",
        )
        return admin_pb.MoveBuildResponse(nodes_moved=moved.nodes, runs_moved=moved.runs)
