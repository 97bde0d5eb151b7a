-- Submit: creating a run.

-- Creates a run and all its steps in one transaction; root steps become available
-- (not before p_start_at when it is later than now), the others pending with
-- deps_open = their number of upstream nodes. With a submit key, at most one run
-- exists per (workflow, key), also under concurrent calls (the second waits on the
-- first's key row): a repeated call returns that run with created = false. A keyed
-- run's id is its key's, submit_key_id(p_workflow, p_submit_key), whatever p_run_id
-- says (the server passes that id, so that Citus routes the call to the run's shard);
-- the key row and the run then live on one shard. p_nodes is
-- a JSON array of node objects in topological order, validated by the server
-- (service/db/runs.py), each with its priority (the node's, else p_priority) and its
-- evaluated concurrency key and limit, if any. p_tags, p_deadline and p_traceparent are
-- stored with the run as given (validated by the server), p_tags also a row per tag in
-- cyclone.run_tags; without p_deadline, a workflow with a default deadline
-- (workflow_deadlines, 72_deadlines.sql) gets created_at + that default. RPCs: Submit,
-- SubmitOnce.
CREATE FUNCTION cyclone.run_submit(
    p_run_id uuid, p_workflow text, p_submit_key text, p_input jsonb, p_nodes jsonb,
    p_start_at timestamptz DEFAULT NULL, p_priority integer DEFAULT 0,
    p_tags jsonb DEFAULT NULL, p_deadline timestamptz DEFAULT NULL,
    p_traceparent text DEFAULT NULL,
    OUT run_id uuid, OUT created boolean)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_now   timestamptz := cyclone.now();
    v_count integer := jsonb_array_length(p_nodes);
    v_ready timestamptz := greatest(v_now, coalesce(p_start_at, v_now));
    v_key   record;
    v_deadline timestamptz;
BEGIN
    IF p_submit_key IS NOT NULL THEN
        p_run_id := cyclone.submit_key_id(p_workflow, p_submit_key);
        -- A concurrent SubmitOnce with the same key waits here for the first to end.
        INSERT INTO cyclone.submit_keys (key_id, workflow, submit_key, run_id, created_at)
        VALUES (p_run_id, p_workflow, p_submit_key, p_run_id, v_now)
        ON CONFLICT (key_id) DO NOTHING;
        IF NOT FOUND THEN
            SELECT k.run_id, k.workflow, k.submit_key INTO v_key FROM cyclone.submit_keys k
             WHERE k.key_id = p_run_id;
            -- Two keys with one SHA-256 prefix: refused rather than answered wrongly.
            IF v_key.workflow <> p_workflow OR v_key.submit_key <> p_submit_key THEN
                RAISE EXCEPTION 'submit key % of workflow % has the id of another key',
                    p_submit_key, p_workflow USING ERRCODE = 'CY004';
            END IF;
            run_id := v_key.run_id;
            created := false;
            RETURN;
        END IF;
    END IF;

    -- Read first: Citus takes no subquery in an INSERT.
    v_deadline := coalesce(p_deadline, v_now + (SELECT d.deadline
                                                  FROM cyclone.workflow_deadlines d
                                                 WHERE d.workflow = p_workflow));
    INSERT INTO cyclone.runs (run_id, workflow, submit_key, status, input, steps_total,
                              steps_open, created_at, updated_at, priority, start_at, tags,
                              deadline, traceparent)
    VALUES (p_run_id, p_workflow, p_submit_key, 'running', p_input, v_count, v_count,
            v_now, v_now, coalesce(p_priority, 0), p_start_at, p_tags, v_deadline,
            p_traceparent);
    IF p_tags IS NOT NULL THEN
        INSERT INTO cyclone.run_tags (run_id, key, value, created_at)
        SELECT p_run_id, t.key, t.value, v_now FROM jsonb_each_text(p_tags) t;
    END IF;

    INSERT INTO cyclone.steps (run_id, node, position, action, status, trigger_rule, depends_on,
                               dependents, deps_open, max_attempts, attempt_budget,
                               initial_backoff, max_backoff, backoff_multiplier, timeout,
                               input, available_at, priority, concurrency_key,
                               concurrency_limit)
    SELECT p_run_id, n.name, n.position, n.action,
           CASE WHEN cardinality(n.depends_on) = 0 THEN 'available' ELSE 'pending' END,
           n.trigger_rule, n.depends_on, n.dependents, cardinality(n.depends_on),
           n.max_attempts, n.max_attempts, make_interval(secs => n.initial_backoff_s),
           make_interval(secs => n.max_backoff_s), n.backoff_multiplier,
           make_interval(secs => n.timeout_s), n.input,
           CASE WHEN cardinality(n.depends_on) = 0 THEN v_ready END,
           coalesce(n.priority, p_priority, 0), n.concurrency_key, n.concurrency_limit
      FROM jsonb_to_recordset(p_nodes) AS n(
               name text, position integer, action text, depends_on text[], dependents text[],
               trigger_rule text, max_attempts integer, initial_backoff_s float8,
               max_backoff_s float8, backoff_multiplier float8, timeout_s float8, input jsonb,
               priority integer, concurrency_key text, concurrency_limit integer);

    -- Also for a run that starts later: a waiting claim that wakes for nothing sets
    -- its timer by the earliest available_at (step_next_due), now the start time.
    PERFORM cyclone._notify_ready(array_agg(e.node->>'action'))
       FROM jsonb_array_elements(p_nodes) e(node)
      WHERE jsonb_array_length(e.node->'depends_on') = 0;
    run_id := p_run_id;
    created := true;
END;
$$;

-- Submit from SQL: cyclone.submit, for an application that creates a run in its own
-- transaction (docs/submit-from-sql.md). It takes the workflow in the JSON shape of a
-- workflow file (`cyclone submit`, pyclient Workflow.from_dict), checks it as the
-- server checks a Submit (cyclone/dag.py, service/api/submit.py) with the server's
-- default limits, and refuses anything invalid with SQLSTATE CY006 and the server's
-- message, before writing anything.

-- A text quoted as Python's repr quotes it, as the server's messages quote input.
CREATE FUNCTION cyclone._repr(p_text text) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
SELECT CASE WHEN strpos(e, '''') > 0 AND strpos(e, '"') = 0 THEN '"' || e || '"'
            ELSE '''' || replace(e, '''', '\''') || '''' END
  FROM (SELECT replace(replace(replace(replace(p_text, '\', '\\'), E'\n', '\n'), E'\r', '\r'),
                       E'\t', '\t') AS e) x;
$$;

-- How a message quotes a client's text: whole when short, else its first 40 characters
-- marked as cut (cyclone.dag.excerpt).
CREATE FUNCTION cyclone._excerpt(p_text text) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
SELECT CASE WHEN length(p_text) <= 40 THEN cyclone._repr(p_text)
            ELSE cyclone._repr(left(p_text, 40))
                 || format('... (cut: %s characters)', length(p_text)) END;
$$;

-- A number as the server's messages write seconds and factors ({:g}).
CREATE FUNCTION cyclone._g(p_value numeric) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
SELECT CASE WHEN p_value = trunc(p_value) AND abs(p_value) < 1000000
            THEN trunc(p_value)::bigint::text
            ELSE p_value::float8::text END;
$$;

-- Raises CY006 (invalid workflow or submit argument) with p_message, when it is set.
CREATE FUNCTION cyclone._refuse(p_message text) RETURNS void
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF p_message IS NOT NULL THEN
        RAISE EXCEPTION '%', p_message USING ERRCODE = 'CY006';
    END IF;
END;
$$;

-- What is wrong with a JSON payload by the server's default limits (--max-payload-bytes
-- 1 MiB of JSON text, --max-json-depth 32), or NULL. A NUL character cannot be in a
-- jsonb value: Postgres refuses it (22P05) before the call.
CREATE FUNCTION cyclone._payload_error(p_value jsonb, p_what text) RETURNS text
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    v_size integer;
BEGIN
    IF p_value IS NULL THEN
        RETURN NULL;
    END IF;
    v_size := octet_length(p_value::text);
    IF v_size > 1048576 THEN
        RETURN format('%s is %s bytes; the limit is 1048576', p_what, v_size);
    END IF;
    -- An item 32 levels below the top is the 33rd level.
    IF jsonb_path_exists(p_value, 'strict $.**{32}') THEN
        RETURN format('%s is nested more than 32 levels deep', p_what);
    END IF;
    RETURN NULL;
END;
$$;

-- A concurrency key template checked (p_render false: NULL), or the key it gives for a
-- run input and a node input (cyclone/flow.py KeyTemplate; docs/flow-control.md).
CREATE FUNCTION cyclone._key_template(p_where text, p_template text, p_render boolean,
                                      p_run jsonb, p_node jsonb) RETURNS text
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    v_len   integer := length(p_template);
    v_pos   integer := 1;
    v_out   text := '';
    v_c     text;
    v_end   integer;
    v_token text;
    v_field text;
    v_path  text[];
    v_value jsonb;
    v_name  text;
BEGIN
    IF p_template = '' THEN
        PERFORM cyclone._refuse(p_where || ': concurrency key is empty');
    END IF;
    IF v_len > 256 THEN
        PERFORM cyclone._refuse(format(
            '%s: concurrency key template is %s characters; the limit is 256', p_where, v_len));
    END IF;
    WHILE v_pos <= v_len LOOP
        v_c := substr(p_template, v_pos, 1);
        IF v_c NOT IN ('{', '}') THEN
            v_out := v_out || v_c;
            v_pos := v_pos + 1;
            CONTINUE;
        END IF;
        IF substr(p_template, v_pos + 1, 1) = v_c THEN
            v_out := v_out || v_c;
            v_pos := v_pos + 2;
            CONTINUE;
        END IF;
        -- A field: '{' then anything but braces up to '}'; else a lone brace.
        v_end := NULL;
        IF v_c = '{' THEN
            v_end := v_pos + coalesce(nullif(strpos(substr(p_template, v_pos + 1), '}'), 0), v_len);
            IF v_end > v_len OR strpos(substr(p_template, v_pos + 1, v_end - v_pos - 1), '{') > 0
            THEN
                v_end := NULL;
            END IF;
        END IF;
        v_token := CASE WHEN v_end IS NULL THEN v_c
                        ELSE substr(p_template, v_pos, v_end - v_pos + 1) END;
        v_field := CASE WHEN v_end IS NOT NULL THEN substr(v_token, 2, length(v_token) - 2) END;
        IF v_field IS NULL OR v_field !~ '^(run|node)(\.[A-Za-z0-9_-]+)+$' THEN
            PERFORM cyclone._refuse(format(
                '%s: concurrency key %s: %s at %s is not a field: write {run.name} or '
                '{node.name} (a dotted path), and {{ or }} for a brace',
                p_where, cyclone._repr(p_template), cyclone._repr(v_token), v_pos - 1));
        END IF;
        v_pos := v_end + 1;
        IF NOT p_render THEN
            CONTINUE;
        END IF;
        v_path := string_to_array(v_field, '.');
        v_value := CASE WHEN v_path[1] = 'run' THEN p_run ELSE p_node END;
        FOREACH v_name IN ARRAY v_path[2:] LOOP
            IF jsonb_typeof(v_value) IS DISTINCT FROM 'object' OR NOT v_value ? v_name THEN
                PERFORM cyclone._refuse(format(
                    '%s: concurrency key field {%s} is missing from the %s input',
                    p_where, v_field, v_path[1]));
            END IF;
            v_value := v_value -> v_name;
        END LOOP;
        v_out := v_out || CASE jsonb_typeof(v_value)
            WHEN 'string' THEN v_value #>> '{}'
            WHEN 'boolean' THEN v_value::text
            WHEN 'number' THEN
                CASE WHEN v_value::numeric = trunc(v_value::numeric)
                          AND abs(v_value::numeric) < 9007199254740992
                     THEN trunc(v_value::numeric)::text
                     ELSE v_value::numeric::float8::text END
            ELSE cyclone._refuse(format(
                '%s: concurrency key field {%s} must be a string, a number or a boolean, got %s',
                p_where, v_field, CASE jsonb_typeof(v_value) WHEN 'object' THEN 'dict'
                                  WHEN 'array' THEN 'list' ELSE 'NoneType' END))::text
        END;
    END LOOP;
    IF NOT p_render THEN
        RETURN NULL;
    END IF;
    IF v_out = '' OR length(v_out) > 256 THEN
        PERFORM cyclone._refuse(format(
            '%s: concurrency key is %s characters; it must be 1 to 256', p_where, length(v_out)));
    END IF;
    RETURN v_out;
END;
$$;

-- The nodes of a workflow in the JSON shape of a workflow file, each as one object of
-- typed fields (absent or null: NULL) with its position (ord, from 1); CY006 names a
-- node that is not in that shape, a field of the wrong type, or an unknown field.
CREATE FUNCTION cyclone._submit_shape(p_workflow jsonb) RETURNS jsonb
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    v_error text;
    v_nodes jsonb;
BEGIN
    IF jsonb_typeof(p_workflow) IS DISTINCT FROM 'object' THEN
        PERFORM cyclone._refuse('a workflow must be a mapping with ''name'' and ''nodes''');
    END IF;
    SELECT format('workflow: unknown field %s; expected one of [''name'', ''nodes'']',
                  cyclone._repr(min(k COLLATE "C")))
      INTO v_error FROM jsonb_object_keys(p_workflow) k WHERE k NOT IN ('name', 'nodes')
    HAVING count(*) > 0;
    PERFORM cyclone._refuse(v_error);
    IF jsonb_typeof(p_workflow->'name') IS DISTINCT FROM 'string' THEN
        PERFORM cyclone._refuse('the workflow needs a ''name'' string');
    END IF;
    IF jsonb_typeof(p_workflow->'nodes') IS DISTINCT FROM 'array' THEN
        PERFORM cyclone._refuse(format('workflow %s needs a ''nodes'' list',
                                       cyclone._repr(p_workflow->>'name')));
    END IF;
    SELECT e INTO v_error FROM (
        SELECT ord, CASE
            WHEN jsonb_typeof(j) IS DISTINCT FROM 'object'
                 OR jsonb_typeof(j->'name') IS DISTINCT FROM 'string'
                THEN format('node #%s must be a mapping with a ''name'' string', ord)
            WHEN (SELECT count(*) FROM jsonb_object_keys(j) k
                   WHERE k NOT IN ('name', 'action', 'depends_on', 'trigger_rule', 'retry',
                                   'timeout', 'input', 'event', 'event_timeout', 'priority',
                                   'concurrency')) > 0
                THEN format('%s: unknown field %s; expected one of [''action'', '
                            '''concurrency'', ''depends_on'', ''event'', ''event_timeout'', '
                            '''input'', ''name'', ''priority'', ''retry'', ''timeout'', '
                            '''trigger_rule'']', w, (
                    SELECT cyclone._repr(min(k COLLATE "C")) FROM jsonb_object_keys(j) k
                     WHERE k NOT IN ('name', 'action', 'depends_on', 'trigger_rule', 'retry',
                                     'timeout', 'input', 'event', 'event_timeout', 'priority',
                                     'concurrency')))
            WHEN coalesce(jsonb_typeof(r), 'object') <> 'object'
                THEN w || ': ''retry'' must be a mapping'
            WHEN r IS NOT NULL AND (SELECT count(*) FROM jsonb_object_keys(r) k
                   WHERE k NOT IN ('max_attempts', 'initial_backoff', 'max_backoff',
                                   'multiplier')) > 0
                THEN format('%s: retry: unknown field %s; expected one of [''initial_backoff'', '
                            '''max_attempts'', ''max_backoff'', ''multiplier'']', w, (
                    SELECT cyclone._repr(min(k COLLATE "C")) FROM jsonb_object_keys(r) k
                     WHERE k NOT IN ('max_attempts', 'initial_backoff', 'max_backoff',
                                     'multiplier')))
            WHEN coalesce(jsonb_typeof(c), 'object') <> 'object'
                THEN w || ': ''concurrency'' must be a mapping'
            WHEN c IS NOT NULL AND (SELECT count(*) FROM jsonb_object_keys(c) k
                                     WHERE k NOT IN ('key', 'limit')) > 0
                THEN format('%s: concurrency: unknown field %s; expected one of [''key'', '
                            '''limit'']', w, (
                    SELECT cyclone._repr(min(k COLLATE "C")) FROM jsonb_object_keys(c) k
                     WHERE k NOT IN ('key', 'limit')))
            WHEN coalesce(jsonb_typeof(j->'depends_on'), 'array') NOT IN ('array', 'null')
                 OR jsonb_path_exists(j, 'lax $.depends_on[*] ? (@.type() != "string")')
                THEN w || ': ''depends_on'' must be a list of node names'
            ELSE (SELECT format('%s: %s must be %s', w, f, CASE t
                                    WHEN 'string' THEN 'a string'
                                    WHEN 'number' THEN 'a number of seconds'
                                    ELSE 'a whole number' END)
                    FROM (VALUES ('''action''', j->'action', 'string', 1),
                                 ('''trigger_rule''', j->'trigger_rule', 'string', 2),
                                 ('''timeout''', j->'timeout', 'number', 3),
                                 ('''event''', j->'event', 'string', 4),
                                 ('''event_timeout''', j->'event_timeout', 'number', 5),
                                 ('''priority''', j->'priority', 'integer', 6),
                                 ('retry ''max_attempts''', r->'max_attempts', 'integer', 7),
                                 ('retry ''initial_backoff''', r->'initial_backoff', 'number', 8),
                                 ('retry ''max_backoff''', r->'max_backoff', 'number', 9),
                                 ('retry ''multiplier''', r->'multiplier', 'number', 10),
                                 ('concurrency ''key''', c->'key', 'string', 11),
                                 ('concurrency ''limit''', c->'limit', 'integer', 12))
                         AS f(f, v, t, i)
                   WHERE coalesce(jsonb_typeof(v), 'null') <> 'null'
                     AND (jsonb_typeof(v) <> CASE t WHEN 'integer' THEN 'number' ELSE t END
                          OR (t = 'integer' AND v::numeric <> trunc(v::numeric)))
                   ORDER BY i LIMIT 1)
        END AS e
          FROM jsonb_array_elements(p_workflow->'nodes') WITH ORDINALITY AS n(j, ord),
               LATERAL (SELECT format('node %s', cyclone._repr(j->>'name')) AS w,
                               nullif(j->'retry', 'null') AS r,
                               nullif(j->'concurrency', 'null') AS c) x
    ) checked WHERE e IS NOT NULL ORDER BY ord LIMIT 1;
    PERFORM cyclone._refuse(v_error);
    SELECT coalesce(jsonb_agg(jsonb_build_object(
               'ord', ord,
               'name', j->>'name',
               'action', j->>'action',
               'depends_on', coalesce(nullif(j->'depends_on', 'null'), '[]'),
               'trigger_rule', coalesce(nullif(j->>'trigger_rule', ''), 'all_success'),
               'max_attempts', coalesce(nullif(j #> '{retry,max_attempts}', 'null'), '3'),
               'initial_backoff_s', coalesce(nullif(j #> '{retry,initial_backoff}', 'null'), '1'),
               'max_backoff_s', coalesce(nullif(j #> '{retry,max_backoff}', 'null'), '300'),
               'backoff_multiplier', coalesce(nullif(j #> '{retry,multiplier}', 'null'), '2'),
               'timeout_s', coalesce(nullif(j->'timeout', 'null'), '300'),
               'input', nullif(j->'input', 'null'),
               'event', nullif(j->'event', 'null'),
               'event_timeout', nullif(j->'event_timeout', 'null'),
               'priority', nullif(j->'priority', 'null'),
               'concurrency_key', CASE WHEN nullif(j->'concurrency', 'null') IS NOT NULL
                                       THEN coalesce(j #>> '{concurrency,key}', '') END,
               'concurrency_limit', CASE WHEN nullif(j->'concurrency', 'null') IS NOT NULL
                                         THEN coalesce(nullif(j #> '{concurrency,limit}', 'null'), '0') END)
               ORDER BY ord), '[]')
      INTO v_nodes
      FROM jsonb_array_elements(p_workflow->'nodes') WITH ORDINALITY AS n(j, ord);
    RETURN v_nodes;
END;
$$;

-- What check_name (cyclone/dag.py) says of a workflow, node or action name, or NULL.
CREATE FUNCTION cyclone._name_error(p_kind text, p_name text) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
SELECT CASE
    WHEN p_name = '' THEN p_kind || ' name is empty'
    WHEN length(p_name) > 128 THEN format('%s name %s is %s characters; the limit is 128',
                                          p_kind, cyclone._excerpt(p_name), length(p_name))
    WHEN p_name !~ '^[A-Za-z_][A-Za-z0-9_.:-]*$'
        THEN format('%s name %s is invalid: use letters, digits and _ . : - and start with '
                    'a letter or _', p_kind, cyclone._excerpt(p_name))
END;
$$;

-- What the server says of one node before the workflow's checks (service/api/submit.py
-- _node_spec): reserved actions, event nodes, the node's input; or NULL.
CREATE FUNCTION cyclone._node_spec_error(p_node jsonb) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
SELECT CASE
    WHEN starts_with(p_node->>'action', 'cyclone.')
        OR (p_node->>'action' IS NULL AND p_node->>'event' IS NULL
            AND starts_with(p_node->>'name', 'cyclone.'))
        THEN format('node %s: action names starting with ''cyclone.'' are the server''s own', w)
    WHEN p_node->>'event' IS NOT NULL AND (p_node->>'action' IS NOT NULL
                                          OR p_node->>'input' IS NOT NULL)
        THEN format('node %s waits for an event: it takes no action and no input', w)
    WHEN p_node->>'event' IS NOT NULL AND (p_node->>'event' = ''
                                          OR length(p_node->>'event') > 200
                                          OR p_node->>'event' ~ '[[:cntrl:]]')
        THEN format('node %s: an event name must be 1 to 200 printable characters, got %s',
                    w, cyclone._excerpt(p_node->>'event'))
    WHEN p_node->>'event' IS NOT NULL
         AND NOT (p_node->'event_timeout' IS NULL
                  OR jsonb_typeof(p_node->'event_timeout') = 'null'
                  OR (p_node->>'event_timeout')::numeric BETWEEN 0.001 AND 31622400)
        THEN format('node %s: an event timeout must be between 1ms and 366 days, got %ss',
                    w, cyclone._g((p_node->>'event_timeout')::numeric))
    WHEN p_node->>'event' IS NULL
        THEN cyclone._payload_error(p_node->'input', format('node %s input', w))
END
  FROM (SELECT cyclone._excerpt(p_node->>'name') AS w) x;
$$;

-- What validate_workflow (cyclone/dag.py) says of one node's name, action and settings
-- (p_twice: the name is an earlier node's too), or NULL.
CREATE FUNCTION cyclone._node_error(p_node jsonb, p_twice boolean) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
SELECT coalesce(cyclone._name_error('node', p_node->>'name'), CASE
    WHEN p_twice THEN format('node %s is defined twice', w)
    ELSE coalesce(cyclone._name_error(format('node %s: action', w), p_node->>'action'), CASE
    WHEN p_node->>'trigger_rule' NOT IN ('all_success', 'all_done', 'one_failed')
        THEN format('node %s: unknown trigger rule %s', w,
                    cyclone._excerpt(p_node->>'trigger_rule'))
    WHEN NOT (p_node->>'max_attempts')::numeric BETWEEN 1 AND 100
        THEN format('node %s: max_attempts must be between 1 and 100, got %s', w,
                    p_node->'max_attempts')
    WHEN NOT (p_node->>'timeout_s')::numeric BETWEEN 1 AND 604800
        THEN format('node %s: timeout must be between 1s and 604800s, got %ss', w,
                    cyclone._g((p_node->>'timeout_s')::numeric))
    WHEN NOT (p_node->>'initial_backoff_s')::numeric BETWEEN 0 AND 86400
        THEN format('node %s: initial_backoff must be between 0s and 86400s, got %ss', w,
                    cyclone._g((p_node->>'initial_backoff_s')::numeric))
    WHEN NOT (p_node->>'max_backoff_s')::numeric
             BETWEEN (p_node->>'initial_backoff_s')::numeric AND 86400
        THEN format('node %s: max_backoff must be between initial_backoff and 86400s, got %ss',
                    w, cyclone._g((p_node->>'max_backoff_s')::numeric))
    WHEN NOT (p_node->>'backoff_multiplier')::numeric BETWEEN 1 AND 10
        THEN format('node %s: backoff_multiplier must be between 1 and 10, got %s', w,
                    cyclone._g((p_node->>'backoff_multiplier')::numeric))
    WHEN NOT coalesce((p_node->>'priority')::numeric, 0) BETWEEN -1000000 AND 1000000
        THEN format('node %s: priority must be between -1000000 and 1000000, got %s', w,
                    p_node->'priority')
    WHEN p_node->>'concurrency_key' IS NOT NULL THEN coalesce(
        cyclone._key_template(format('node %s', w), p_node->>'concurrency_key', false,
                              NULL, NULL),
        CASE WHEN NOT (p_node->>'concurrency_limit')::numeric BETWEEN 1 AND 10000
             THEN format('node %s: concurrency limit must be between 1 and 10000, got %s', w,
                         p_node->'concurrency_limit') END)
    END) END)
  FROM (SELECT cyclone._repr(p_node->>'name') AS w) x;
$$;

-- A workflow (the JSON shape of a workflow file) and its run input as run_submit's
-- p_nodes: checked as the server checks a Submit, in the same order and with the same
-- messages (CY006), with the server's default limits (5000 nodes, 1000 dependencies and
-- 1000 dependents per node, 100000 in all); defaults applied, in topological order with
-- each node's dependents, its concurrency key evaluated for the run input.
CREATE FUNCTION cyclone._submit_nodes(p_workflow jsonb, p_input jsonb) RETURNS jsonb
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    v_nodes jsonb := cyclone._submit_shape(p_workflow);
    v_name  text := p_workflow->>'name';
    v_count integer := jsonb_array_length(v_nodes);
    v_edges integer;
    v_error text;
BEGIN
    IF v_count > 5000 THEN
        PERFORM cyclone._refuse(format('workflow %s has %s nodes; the limit is 5000',
                                       cyclone._excerpt(v_name), v_count));
    END IF;
    SELECT coalesce(sum(jsonb_array_length(n->'depends_on')), 0) INTO v_edges
      FROM jsonb_array_elements(v_nodes) n;
    IF v_edges > 100000 THEN
        PERFORM cyclone._refuse(format('workflow %s has %s dependencies in all; the limit is '
                                       '100000', cyclone._excerpt(v_name), v_edges));
    END IF;
    SELECT e INTO v_error FROM (SELECT cyclone._node_spec_error(n) AS e, ord
                                  FROM jsonb_array_elements(v_nodes) WITH ORDINALITY n(n, ord)) x
     WHERE e IS NOT NULL ORDER BY ord LIMIT 1;
    PERFORM cyclone._refuse(v_error);
    -- As the server stores them: an event node's reserved action and its input.
    SELECT coalesce(jsonb_agg(CASE
               WHEN n->>'event' IS NULL
                   THEN n || jsonb_build_object('action', coalesce(n->>'action', n->>'name'))
               ELSE n || jsonb_build_object(
                   'action', 'cyclone.event',
                   'input', jsonb_build_object('event', n->>'event',
                                               'timeout_s', n->'event_timeout')) END
               ORDER BY ord), '[]')
      INTO v_nodes FROM jsonb_array_elements(v_nodes) WITH ORDINALITY n(n, ord);
    PERFORM cyclone._refuse(cyclone._name_error('workflow', v_name));
    IF v_count = 0 THEN
        PERFORM cyclone._refuse(format('workflow %s has no nodes', cyclone._excerpt(v_name)));
    END IF;
    SELECT e INTO v_error FROM (
        SELECT cyclone._node_error(n, row_number() OVER (PARTITION BY n->>'name' ORDER BY ord) > 1)
                   AS e, ord
          FROM jsonb_array_elements(v_nodes) WITH ORDINALITY n(n, ord)) x
     WHERE e IS NOT NULL ORDER BY ord LIMIT 1;
    PERFORM cyclone._refuse(v_error);
    v_nodes := cyclone._submit_order(v_nodes);
    PERFORM cyclone._refuse(cyclone._payload_error(p_input, 'run input'));
    -- Concurrency keys, evaluated for this run input (docs/flow-control.md).
    SELECT jsonb_agg(CASE WHEN n->>'concurrency_key' IS NULL THEN n
                          ELSE n || jsonb_build_object('concurrency_key', cyclone._key_template(
                              format('node %s', cyclone._repr(n->>'name')),
                              n->>'concurrency_key', true, p_input, n->'input')) END
                     ORDER BY ord)
      INTO v_nodes FROM jsonb_array_elements(v_nodes) WITH ORDINALITY n(n, ord);
    RETURN v_nodes;
END;
$$;

-- The checked nodes of a workflow (_submit_nodes) in topological order as run_submit
-- takes them, each with its dependents and position; CY006 for dependencies that
-- validate_workflow refuses: too many, on itself, on an unknown node, listed twice,
-- too many dependents of one node, a cycle (named as a path of nodes).
CREATE FUNCTION cyclone._submit_order(p_nodes jsonb) RETURNS jsonb
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    v_n      integer := jsonb_array_length(p_nodes);
    v_index  jsonb;
    v_error  text;
    v_indeg  integer[];
    v_start  integer[];
    v_adj    integer[];
    v_queue  integer[] := '{}';
    v_head   integer := 1;
    v_i      integer;
    v_j      integer;
    v_seen   jsonb;
    v_path   text[];
BEGIN
    SELECT jsonb_object_agg(n->>'name', ord) INTO v_index
      FROM jsonb_array_elements(p_nodes) WITH ORDINALITY n(n, ord);
    SELECT e INTO v_error FROM (
        SELECT ord, 0 AS i, format('node %s has %s dependencies; the limit is 1000',
                                   cyclone._repr(n->>'name'), jsonb_array_length(n->'depends_on'))
                   AS e
          FROM jsonb_array_elements(p_nodes) WITH ORDINALITY n(n, ord)
         WHERE jsonb_array_length(n->'depends_on') > 1000
        UNION ALL
        SELECT ord, i, CASE
            WHEN d = n->>'name' THEN format('node %s depends on itself', cyclone._repr(d))
            WHEN NOT v_index ? d THEN format('node %s depends on unknown node %s',
                                             cyclone._repr(n->>'name'), cyclone._excerpt(d))
            WHEN row_number() OVER (PARTITION BY ord, d ORDER BY i) > 1
                THEN format('node %s lists dependency %s twice', cyclone._repr(n->>'name'),
                            cyclone._excerpt(d))
            END
          FROM jsonb_array_elements(p_nodes) WITH ORDINALITY n(n, ord),
               jsonb_array_elements_text(n->'depends_on') WITH ORDINALITY d(d, i)
    ) x WHERE e IS NOT NULL ORDER BY ord, i LIMIT 1;
    PERFORM cyclone._refuse(v_error);
    -- Fan-out, by upstream node in the workflow's order.
    SELECT format('node %s has %s dependents; the limit is 1000', cyclone._repr(d), count(*))
      INTO v_error
      FROM jsonb_array_elements(p_nodes) n, jsonb_array_elements_text(n->'depends_on') d
     GROUP BY d HAVING count(*) > 1000 ORDER BY min((v_index->>d)::integer) LIMIT 1;
    PERFORM cyclone._refuse(v_error);

    -- Kahn's algorithm over integer arrays, in time linear in nodes plus edges: v_adj
    -- holds every node's dependents, from v_start[i] to v_start[i + 1] - 1.
    SELECT array_agg(jsonb_array_length(n->'depends_on') ORDER BY ord) INTO v_indeg
      FROM jsonb_array_elements(p_nodes) WITH ORDINALITY n(n, ord);
    SELECT coalesce(array_agg(down ORDER BY up, down), '{}') INTO v_adj
      FROM (SELECT (v_index->>d)::integer AS up, ord::integer AS down
              FROM jsonb_array_elements(p_nodes) WITH ORDINALITY n(n, ord),
                   jsonb_array_elements_text(n->'depends_on') d) e;
    SELECT array_agg(s ORDER BY g) INTO v_start
      FROM (SELECT g, 1 + coalesce(sum(coalesce(c.cnt, 0)) OVER (
                          ORDER BY g ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), 0) AS s
              FROM generate_series(1, v_n + 1) g
              LEFT JOIN (SELECT (v_index->>d)::integer AS up, count(*) AS cnt
                           FROM jsonb_array_elements(p_nodes) n,
                                jsonb_array_elements_text(n->'depends_on') d
                          GROUP BY 1) c ON c.up = g) x;
    FOR v_i IN 1 .. v_n LOOP
        IF v_indeg[v_i] = 0 THEN
            v_queue := v_queue || v_i;
        END IF;
    END LOOP;
    WHILE v_head <= cardinality(v_queue) LOOP
        v_i := v_queue[v_head];
        v_head := v_head + 1;
        FOR v_j IN v_start[v_i] .. v_start[v_i + 1] - 1 LOOP
            v_indeg[v_adj[v_j]] := v_indeg[v_adj[v_j]] - 1;
            IF v_indeg[v_adj[v_j]] = 0 THEN
                v_queue := v_queue || v_adj[v_j];
            END IF;
        END LOOP;
    END LOOP;
    IF cardinality(v_queue) < v_n THEN
        -- Every node left has an upstream node left: walking up from one meets a cycle.
        SELECT min(i) INTO v_i FROM generate_subscripts(v_indeg, 1) i WHERE v_indeg[i] > 0;
        v_seen := '{}';
        v_path := '{}';
        WHILE NOT v_seen ? v_i::text LOOP
            v_seen := v_seen || jsonb_build_object(v_i::text, cardinality(v_path) + 1);
            v_path := v_path || (p_nodes -> (v_i - 1) ->> 'name');
            SELECT (v_index->>d)::integer INTO v_i
              FROM jsonb_array_elements_text(p_nodes -> (v_i - 1) -> 'depends_on') d
             WHERE v_indeg[(v_index->>d)::integer] > 0 LIMIT 1;
        END LOOP;
        -- From upstream to downstream, the first node repeated at the end.
        v_path := v_path[(v_seen->>v_i::text)::integer:];
        SELECT array_agg(v_path[k] ORDER BY k DESC) INTO v_path
          FROM generate_subscripts(v_path, 1) k;
        v_path := v_path || v_path[1];
        PERFORM cyclone._refuse(format(
            'node %s is part of a cycle: %s', cyclone._repr(v_path[1]),
            (SELECT string_agg(cyclone._excerpt(p), ' -> ' ORDER BY k)
               FROM unnest(v_path[1:5]) WITH ORDINALITY u(p, k))
            || CASE WHEN cardinality(v_path) > 5
                    THEN format(' -> ... (cut: %s nodes)', cardinality(v_path)) ELSE '' END));
    END IF;
    RETURN (
        SELECT jsonb_agg(jsonb_build_object(
                   'name', n->>'name', 'action', n->>'action', 'depends_on', n->'depends_on',
                   'dependents', coalesce((
                       SELECT jsonb_agg(m->>'name' ORDER BY m->>'name' COLLATE "C")
                         FROM unnest(v_adj[v_start[q.i]:v_start[q.i + 1] - 1]) a
                         JOIN LATERAL (SELECT p_nodes -> (a - 1) AS m) mm ON true), '[]'),
                   'trigger_rule', n->>'trigger_rule',
                   'max_attempts', (n->>'max_attempts')::numeric::integer,
                   'initial_backoff_s', (n->>'initial_backoff_s')::float8,
                   'max_backoff_s', (n->>'max_backoff_s')::float8,
                   'backoff_multiplier', (n->>'backoff_multiplier')::float8,
                   'timeout_s', (n->>'timeout_s')::float8,
                   'input', n->'input',
                   'priority', (n->>'priority')::integer,
                   'concurrency_key', n->>'concurrency_key',
                   'concurrency_limit', (n->>'concurrency_limit')::numeric::integer,
                   'position', q.k - 1)
               ORDER BY q.k)
          FROM unnest(v_queue) WITH ORDINALITY q(i, k),
               LATERAL (SELECT p_nodes -> (q.i - 1) AS n) x);
END;
$$;

-- A new run's id, a UUID version 7 (a millisecond time, then random bits) as the server
-- makes one: runs are listed by id and time.
CREATE FUNCTION cyclone._uuid7() RETURNS uuid
LANGUAGE sql VOLATILE AS $$
SELECT encode(set_byte(overlay(uuid_send(gen_random_uuid())
                               PLACING substring(int8send(floor(extract(epoch FROM
                                   clock_timestamp()) * 1000)::bigint) FROM 3)
                               FROM 1 FOR 6),
                       6, (get_byte(uuid_send(gen_random_uuid()), 6) & 15) | 112),
              'hex')::uuid;
$$;

-- What the server says of SubmitOnce's key, the run's priority, start time and tags,
-- or NULL. Tags: at most 16; a key is 1-64 letters, digits or . _ - / : ; a value a
-- string of at most 256 characters.
CREATE FUNCTION cyclone._submit_args_error(p_key text, p_start_at timestamptz,
                                           p_priority integer, p_tags jsonb) RETURNS text
LANGUAGE sql AS $$
SELECT CASE
    WHEN p_key = '' THEN 'submit key is empty'
    WHEN length(p_key) > 256
        THEN format('submit key is %s characters; the limit is 256', length(p_key))
    WHEN NOT coalesce(p_priority, 0) BETWEEN -1000000 AND 1000000
        THEN format('run: priority must be between -1000000 and 1000000, got %s', p_priority)
    WHEN p_start_at > clock_timestamp() + interval '366 days'
        THEN format('start_at is %s days ahead; the limit is 366 days',
                    round(extract(epoch FROM p_start_at - clock_timestamp()) / 86400))
    WHEN p_tags IS NULL OR jsonb_typeof(p_tags) = 'null' THEN NULL
    WHEN jsonb_typeof(p_tags) <> 'object'
        THEN 'tags must be a JSON object of key = value strings'
    WHEN (SELECT count(*) FROM jsonb_object_keys(p_tags)) > 16
        THEN format('tags: %s tags; the limit is 16', (SELECT count(*) FROM jsonb_object_keys(p_tags)))
    ELSE (SELECT CASE
              WHEN k !~ '^[A-Za-z0-9._/:-]{1,64}$'
                  THEN format('tag key %s is invalid: use 1 to 64 letters, digits and . _ - / :',
                              cyclone._excerpt(k))
              WHEN jsonb_typeof(v) <> 'string'
                  THEN format('tag %s: the value must be a string', cyclone._repr(k))
              WHEN length(v #>> '{}') > 256
                  THEN format('tag %s: the value is %s characters; the limit is 256',
                              cyclone._repr(k), length(v #>> '{}'))
              END AS e
            FROM jsonb_each(p_tags) t(k, v)
           ORDER BY (k !~ '^[A-Za-z0-9._/:-]{1,64}$' OR jsonb_typeof(v) <> 'string'
                     OR length(v #>> '{}') > 256) DESC, k COLLATE "C" LIMIT 1)
END;
$$;

-- A time as Python's datetime.isoformat writes a UTC one, as the server's messages do.
CREATE FUNCTION cyclone._iso(p_at timestamptz) RETURNS text
LANGUAGE sql STABLE AS $$
SELECT to_char(p_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS')
       || CASE WHEN extract(microseconds FROM p_at)::bigint % 1000000 = 0 THEN ''
               ELSE to_char(p_at AT TIME ZONE 'UTC', '.US') END
       || '+00:00';
$$;

-- What is wrong with a run's deadline (p_deadline, NULL: none given), as Submit says it
-- (service/api/submit.py deadline_time): not in the future, more than 366 days ahead,
-- or not after the run's start time. NULL when nothing is.
CREATE FUNCTION cyclone._deadline_error(p_deadline timestamptz, p_start_at timestamptz)
RETURNS text
LANGUAGE sql AS $$
SELECT CASE
    WHEN p_deadline IS NULL THEN NULL
    WHEN p_deadline <= clock_timestamp()
        THEN format('deadline %s is not in the future (now %s)', cyclone._iso(p_deadline),
                    cyclone._iso(clock_timestamp()))
    WHEN p_deadline > clock_timestamp() + interval '366 days'
        THEN format('deadline is %s days ahead; the limit is 366 days',
                    round(extract(epoch FROM p_deadline - clock_timestamp()) / 86400))
    WHEN p_start_at IS NOT NULL AND p_deadline <= p_start_at
        THEN format('deadline %s is not after start_at %s', cyclone._iso(p_deadline),
                    cyclone._iso(p_start_at))
END;
$$;

-- Submit from SQL: creates a run of p_workflow in the caller's transaction, so that it
-- commits, or rolls back, with the caller's own writes (docs/submit-from-sql.md). The
-- workflow is JSON in the shape of a workflow file (`cyclone submit`); it is checked as
-- Submit checks it, by the server's default limits, and refused with SQLSTATE CY006 and
-- the server's message before anything is written. With a key, as SubmitOnce: at most
-- one run per (workflow name, key); a repeat returns that run with created = false.
-- Without a deadline the workflow's default applies (workflow_deadlines), as in Submit.
-- Waiting claims are notified at commit (run_submit; a rollback drops the notification).
-- SECURITY DEFINER with a pinned search_path: the one function the cyclone_client role
-- may call (90_roles.sql).
CREATE FUNCTION cyclone.submit(
    workflow jsonb, input jsonb DEFAULT NULL, key text DEFAULT NULL,
    start_at timestamptz DEFAULT NULL, priority integer DEFAULT 0, tags jsonb DEFAULT NULL,
    deadline timestamptz DEFAULT NULL, OUT run_id uuid, OUT created boolean)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_name  text := submit.workflow->>'name';
    v_nodes jsonb;
    v_run   uuid;
BEGIN
    PERFORM cyclone._refuse(cyclone._submit_args_error(submit.key, submit.start_at,
                                                       submit.priority, submit.tags));
    PERFORM cyclone._refuse(cyclone._deadline_error(submit.deadline, submit.start_at));
    v_nodes := cyclone._submit_nodes(submit.workflow, submit.input);
    v_run := CASE WHEN submit.key IS NULL THEN cyclone._uuid7()
                  ELSE cyclone.submit_key_id(v_name, submit.key) END;
    SELECT s.run_id, s.created INTO submit.run_id, submit.created
      FROM cyclone.run_submit(v_run, v_name, submit.key, submit.input, v_nodes,
                              submit.start_at, coalesce(submit.priority, 0),
                              nullif(nullif(submit.tags, 'null'), '{}'), submit.deadline) s;
END;
$$;
