-- A schedule's nodes hold its concurrency keys evaluated for its input: CreateSchedule
-- evaluates the templates, as Submit does, instead of storing them as written (every
-- firing then shared one key, whatever the input). Schedules stored before keep their
-- templates; they are marked here, and the firing pass evaluates their keys (from the
-- workflow and input kept with them) before it fires them again.
ALTER TABLE cyclone.schedules ADD COLUMN nodes_keyed boolean NOT NULL DEFAULT true;

UPDATE cyclone.schedules s
   SET nodes_keyed = false
 WHERE EXISTS (SELECT 1 FROM jsonb_array_elements(s.nodes) n
                WHERE n.value ->> 'concurrency_key' IS NOT NULL);
