"""docs/submit-from-sql.md: its plain SQL example and its psycopg example run as
written against a real Cyclone database, and each submits the run it says; the role
commands work as shown."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import psycopg
import pytest

PAGE = Path(__file__).resolve().parent.parent / "docs" / "submit-from-sql.md"
BLOCKS = re.findall(r"^```(\w*)\n(.*?)^```", PAGE.read_text(), re.MULTILINE | re.DOTALL)
ORDERS = "CREATE TABLE orders (id text PRIMARY KEY, customer text, amount integer, run_id uuid)"


def _block(language: str, containing: str) -> str:
    [code] = [c for lang, c in BLOCKS if lang == language and containing in c]
    return code


@pytest.fixture
def shop(cyclone_server: Any) -> str:
    cyclone_server.sql(ORDERS)
    return cyclone_server.database_url


def test_the_plain_sql_example_commits_the_order_and_its_run(cyclone_server, shop):
    with psycopg.connect(shop, autocommit=True) as conn:
        conn.execute(_block("sql", "INSERT INTO orders"))
    assert cyclone_server.sql("SELECT id FROM orders") == [("o-2002",)]
    assert cyclone_server.sql("SELECT workflow, submit_key, input FROM cyclone.runs") == [
        ("order", "o-2002", {"order_id": "o-2002", "amount": 1500})
    ]


def test_the_psycopg_example_runs_as_written(cyclone_server, shop, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    workflow = {
        "name": "order",
        "nodes": [{"name": "charge"}, {"name": "send_receipt", "depends_on": ["charge"]}],
    }
    (tmp_path / "order.json").write_text(json.dumps(workflow))
    exec(compile(_block("python", "cyclone.submit"), str(PAGE), "exec"), {"DATABASE_URL": shop})
    [(run_id,)] = cyclone_server.sql("SELECT run_id FROM orders WHERE id = 'o-2002'")
    assert cyclone_server.sql("SELECT run_id, steps_total FROM cyclone.runs") == [(run_id, 2)]


def test_the_role_commands_give_a_login_that_may_submit(cyclone_server, shop):
    grants = _block("sql", "GRANT cyclone_client").replace("'...'", "'secret'")
    role = "shop"
    try:
        with psycopg.connect(shop, autocommit=True) as conn:
            for statement in re.sub(r"--.*", "", grants).split(";"):
                if statement.strip():
                    conn.execute(statement)
        login = psycopg.conninfo.make_conninfo(shop, user=role, password="secret")
        with psycopg.connect(login) as conn:
            conn.execute(
                _block("sql", "INSERT INTO orders").replace("BEGIN;", "").replace("COMMIT;", "")
            )
        assert cyclone_server.sql("SELECT count(*) FROM cyclone.runs") == [(1,)]
    finally:
        with psycopg.connect(shop, autocommit=True) as conn:
            if conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (role,)).fetchone():
                conn.execute(f"DROP OWNED BY {role}")
                conn.execute(f"DROP ROLE {role}")
