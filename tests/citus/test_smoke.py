from tests.helpers import claim, complete, get_run, node, run_status, submit, workflow


def test_smoke(cyclone_server):
    run_id = submit(cyclone_server, workflow("w", node("a"), node("b", deps=["a"])))
    (a,) = claim(cyclone_server, "work")
    complete(cyclone_server, a, 1)
    (b,) = claim(cyclone_server, "work")
    complete(cyclone_server, b, 2)
    assert run_status(get_run(cyclone_server, run_id)) == "completed"
