"""No Cyclone function is executable by PUBLIC, whichever migration created it: the
worker role may call step_complete and step_call_record and nothing else."""

from __future__ import annotations

from service.migrate import migrate

WORKER_MAY_EXECUTE = """
SELECT p.oid::regprocedure::text FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
 WHERE n.nspname = 'cyclone' AND has_function_privilege('cyclone_worker', p.oid, 'EXECUTE')
 ORDER BY 1
"""


WORKER_FUNCTIONS = [
    "cyclone.step_call_record(uuid,text,uuid,text,integer,text,jsonb,text)",
    "cyclone.step_complete(uuid,text,uuid,jsonb)",
]


def test_the_worker_role_may_execute_step_complete_and_no_other_function(cyclone_server):
    rows = cyclone_server.sql(WORKER_MAY_EXECUTE)
    assert [r[0] for r in rows] == WORKER_FUNCTIONS


def test_migrate_takes_back_what_public_was_given_since(cyclone_server):
    # As a function created by a migration after 0005 is, until migrate revokes it.
    cyclone_server.sql("GRANT EXECUTE ON FUNCTION cyclone.sweep(integer, integer) TO PUBLIC")
    assert len(cyclone_server.sql(WORKER_MAY_EXECUTE)) == 3
    assert migrate(cyclone_server.database_url) == []  # nothing left to apply
    rows = cyclone_server.sql(WORKER_MAY_EXECUTE)
    assert [r[0] for r in rows] == WORKER_FUNCTIONS
