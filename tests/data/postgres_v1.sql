-- A PostgreSQL session store of schema version 1, written by agent_flow at commit fe3f868
-- (tests/data/make_old_stores.py) and dumped with pg_dump --inserts; __SCHEMA__ stands for the
-- schema a test loads it into.
CREATE SCHEMA __SCHEMA__;
CREATE TABLE __SCHEMA__.agent_flow_schema (
    version integer NOT NULL
);
CREATE TABLE __SCHEMA__.entries (
    session_id text NOT NULL,
    "position" integer NOT NULL,
    entry_id text NOT NULL,
    kind text NOT NULL,
    data text NOT NULL
);
CREATE TABLE __SCHEMA__.environment_changes (
    session_id text NOT NULL,
    version integer NOT NULL,
    data text NOT NULL
);
CREATE TABLE __SCHEMA__.events (
    session_id text NOT NULL,
    "position" integer NOT NULL,
    run_id text NOT NULL,
    seq integer NOT NULL,
    kind text NOT NULL,
    data text NOT NULL
);
CREATE TABLE __SCHEMA__.sessions (
    id text NOT NULL,
    agent text NOT NULL,
    title text NOT NULL,
    status text NOT NULL,
    created_at timestamp with time zone NOT NULL,
    updated_at timestamp with time zone NOT NULL,
    metadata text NOT NULL,
    steps integer NOT NULL,
    entry_count integer NOT NULL,
    event_count integer NOT NULL,
    environment_version integer NOT NULL,
    environment text,
    revision text NOT NULL,
    task text
);
INSERT INTO __SCHEMA__.agent_flow_schema VALUES (1);
INSERT INTO __SCHEMA__.entries VALUES ('priced', 0, '7fc1098f91e14d088f39f5fa31ab565a', 'user_message', '{"id":"7fc1098f91e14d088f39f5fa31ab565a","timestamp":"2026-11-23T15:09:37.380274Z","kind":"user_message","content":"step 0"}');
INSERT INTO __SCHEMA__.entries VALUES ('priced', 1, '4f2a7535489a4bbca4eacea714490f7d', 'agent_message', '{"id":"4f2a7535489a4bbca4eacea714490f7d","timestamp":"2026-11-23T15:09:37.380387Z","kind":"agent_message","content":"done 0"}');
INSERT INTO __SCHEMA__.entries VALUES ('priced', 2, '5309658d16f249019aaab8afa297eb2c', 'user_message', '{"id":"5309658d16f249019aaab8afa297eb2c","timestamp":"2026-11-23T15:09:37.420782Z","kind":"user_message","content":"step 1"}');
INSERT INTO __SCHEMA__.entries VALUES ('priced', 3, '536841ed954c40e287c253b46192bd72', 'agent_message', '{"id":"536841ed954c40e287c253b46192bd72","timestamp":"2026-11-23T15:09:37.420897Z","kind":"agent_message","content":"done 1"}');
INSERT INTO __SCHEMA__.entries VALUES ('priced', 4, '313e6a24ddfa47f3a47d5f367a460686', 'user_message', '{"id":"313e6a24ddfa47f3a47d5f367a460686","timestamp":"2026-11-23T15:09:37.448690Z","kind":"user_message","content":"step 2"}');
INSERT INTO __SCHEMA__.entries VALUES ('priced', 5, 'd9004b59cbea410795518da4f91e1e80', 'agent_message', '{"id":"d9004b59cbea410795518da4f91e1e80","timestamp":"2026-11-23T15:09:37.448820Z","kind":"agent_message","content":"done 2"}');
INSERT INTO __SCHEMA__.entries VALUES ('unpriced', 0, '59b8911845d7435f841d7dc239cad325', 'user_message', '{"id":"59b8911845d7435f841d7dc239cad325","timestamp":"2026-11-23T15:09:37.499882Z","kind":"user_message","content":"step 0"}');
INSERT INTO __SCHEMA__.entries VALUES ('unpriced', 1, '79c32f1947e54a779c6d9bd49558aec3', 'agent_message', '{"id":"79c32f1947e54a779c6d9bd49558aec3","timestamp":"2026-11-23T15:09:37.499950Z","kind":"agent_message","content":"done 0"}');
INSERT INTO __SCHEMA__.entries VALUES ('unpriced', 2, '08d8af2b9a1243bb89a3aa9d2a302b25', 'user_message', '{"id":"08d8af2b9a1243bb89a3aa9d2a302b25","timestamp":"2026-11-23T15:09:37.529173Z","kind":"user_message","content":"step 1"}');
INSERT INTO __SCHEMA__.entries VALUES ('unpriced', 3, '8906d53cfabb429cb3aebc41a4a0274b', 'agent_message', '{"id":"8906d53cfabb429cb3aebc41a4a0274b","timestamp":"2026-11-23T15:09:37.529271Z","kind":"agent_message","content":"done 1"}');
INSERT INTO __SCHEMA__.entries VALUES ('unpriced', 4, 'bc858e1f9ad7429d941e17817fa0d909', 'user_message', '{"id":"bc858e1f9ad7429d941e17817fa0d909","timestamp":"2026-11-23T15:09:37.556483Z","kind":"user_message","content":"step 2"}');
INSERT INTO __SCHEMA__.entries VALUES ('unpriced', 5, '4bfca741996441a68dc0ef00c9ad39dc', 'agent_message', '{"id":"4bfca741996441a68dc0ef00c9ad39dc","timestamp":"2026-11-23T15:09:37.556577Z","kind":"agent_message","content":"done 2"}');
INSERT INTO __SCHEMA__.environment_changes VALUES ('priced', 1, '{"version":1,"op":"set","pointer":"/extensions/step","old":null,"new":0}');
INSERT INTO __SCHEMA__.environment_changes VALUES ('priced', 2, '{"version":2,"op":"set","pointer":"/extensions/step","old":0,"new":1}');
INSERT INTO __SCHEMA__.environment_changes VALUES ('priced', 3, '{"version":3,"op":"set","pointer":"/extensions/step","old":1,"new":2}');
INSERT INTO __SCHEMA__.environment_changes VALUES ('unpriced', 1, '{"version":1,"op":"set","pointer":"/extensions/step","old":null,"new":0}');
INSERT INTO __SCHEMA__.environment_changes VALUES ('unpriced', 2, '{"version":2,"op":"set","pointer":"/extensions/step","old":0,"new":1}');
INSERT INTO __SCHEMA__.environment_changes VALUES ('unpriced', 3, '{"version":3,"op":"set","pointer":"/extensions/step","old":1,"new":2}');
INSERT INTO __SCHEMA__.events VALUES ('priced', 0, 'run-priced-0', 0, 'text_delta', '{"run_id":"run-priced-0","seq":0,"timestamp":"2026-11-23T15:09:37.380594Z","kind":"text_delta","text":"x"}');
INSERT INTO __SCHEMA__.events VALUES ('priced', 1, 'run-priced-0', 1, 'model_responded', '{"run_id":"run-priced-0","seq":1,"timestamp":"2026-11-23T15:09:37.380614Z","kind":"model_responded","iteration":1,"finish_reason":"stop","prompt_tokens":100,"completion_tokens":10,"tool_calls":0,"duration_ms":5.0,"source":"agent","cached_tokens":null,"reasoning_tokens":null,"model":"gpt-4o-mini","cost_usd":0.0012}');
INSERT INTO __SCHEMA__.events VALUES ('priced', 2, 'run-priced-1', 0, 'text_delta', '{"run_id":"run-priced-1","seq":0,"timestamp":"2026-11-23T15:09:37.421049Z","kind":"text_delta","text":"x"}');
INSERT INTO __SCHEMA__.events VALUES ('priced', 3, 'run-priced-1', 1, 'model_responded', '{"run_id":"run-priced-1","seq":1,"timestamp":"2026-11-23T15:09:37.421068Z","kind":"model_responded","iteration":1,"finish_reason":"stop","prompt_tokens":101,"completion_tokens":11,"tool_calls":0,"duration_ms":5.0,"source":"summarizer","cached_tokens":null,"reasoning_tokens":null,"model":"gpt-4o-mini","cost_usd":0.0003}');
INSERT INTO __SCHEMA__.events VALUES ('priced', 4, 'run-priced-2', 0, 'text_delta', '{"run_id":"run-priced-2","seq":0,"timestamp":"2026-11-23T15:09:37.448989Z","kind":"text_delta","text":"x"}');
INSERT INTO __SCHEMA__.events VALUES ('priced', 5, 'run-priced-2', 1, 'model_responded', '{"run_id":"run-priced-2","seq":1,"timestamp":"2026-11-23T15:09:37.449010Z","kind":"model_responded","iteration":1,"finish_reason":"stop","prompt_tokens":102,"completion_tokens":12,"tool_calls":0,"duration_ms":5.0,"source":"agent","cached_tokens":null,"reasoning_tokens":null,"model":"gpt-4o-mini","cost_usd":0.1}');
INSERT INTO __SCHEMA__.events VALUES ('unpriced', 0, 'run-unpriced-0', 0, 'text_delta', '{"run_id":"run-unpriced-0","seq":0,"timestamp":"2026-11-23T15:09:37.500151Z","kind":"text_delta","text":"x"}');
INSERT INTO __SCHEMA__.events VALUES ('unpriced', 1, 'run-unpriced-0', 1, 'model_responded', '{"run_id":"run-unpriced-0","seq":1,"timestamp":"2026-11-23T15:09:37.500164Z","kind":"model_responded","iteration":1,"finish_reason":"stop","prompt_tokens":100,"completion_tokens":10,"tool_calls":0,"duration_ms":5.0,"source":"agent","cached_tokens":null,"reasoning_tokens":null,"model":"gpt-4o-mini","cost_usd":0.002}');
INSERT INTO __SCHEMA__.events VALUES ('unpriced', 2, 'run-unpriced-1', 0, 'text_delta', '{"run_id":"run-unpriced-1","seq":0,"timestamp":"2026-11-23T15:09:37.529410Z","kind":"text_delta","text":"x"}');
INSERT INTO __SCHEMA__.events VALUES ('unpriced', 3, 'run-unpriced-1', 1, 'model_responded', '{"run_id":"run-unpriced-1","seq":1,"timestamp":"2026-11-23T15:09:37.529425Z","kind":"model_responded","iteration":1,"finish_reason":"stop","prompt_tokens":101,"completion_tokens":11,"tool_calls":0,"duration_ms":5.0,"source":"summarizer","cached_tokens":null,"reasoning_tokens":null,"model":"gpt-4o-mini","cost_usd":null}');
INSERT INTO __SCHEMA__.events VALUES ('unpriced', 4, 'run-unpriced-2', 0, 'text_delta', '{"run_id":"run-unpriced-2","seq":0,"timestamp":"2026-11-23T15:09:37.556716Z","kind":"text_delta","text":"x"}');
INSERT INTO __SCHEMA__.events VALUES ('unpriced', 5, 'run-unpriced-2', 1, 'model_responded', '{"run_id":"run-unpriced-2","seq":1,"timestamp":"2026-11-23T15:09:37.556735Z","kind":"model_responded","iteration":1,"finish_reason":"stop","prompt_tokens":102,"completion_tokens":12,"tool_calls":0,"duration_ms":5.0,"source":"agent","cached_tokens":null,"reasoning_tokens":null,"model":"gpt-4o-mini","cost_usd":0.5}');
INSERT INTO __SCHEMA__.sessions VALUES ('priced', 'agent', '', 'completed', '2026-11-23 15:09:37.364717+00', '2026-11-23 15:09:37.449536+00', '{}', 3, 6, 6, 3, '{"format":1,"version":3,"state":{"system":{"working_directory":"","permissions":[],"resources":{}},"task":{"objective":"","status":"not_started","steps_completed":0,"steps_total":0,"current_step":null,"plan":[]},"knowledge":{"discovered_facts":[],"sources":{},"key_concepts":[],"extra":{}},"workspace":{"files":{},"artifacts":[],"extra":{}},"extensions":{"step":2}},"schema":null,"extension_schemas":{},"max_changes":10000}', '5a700bc1251e4fd3bd7bd33eabe04658', 'task priced');
INSERT INTO __SCHEMA__.sessions VALUES ('unpriced', 'agent', '', 'completed', '2026-11-23 15:09:37.475707+00', '2026-11-23 15:09:37.557111+00', '{}', 3, 6, 6, 3, '{"format":1,"version":3,"state":{"system":{"working_directory":"","permissions":[],"resources":{}},"task":{"objective":"","status":"not_started","steps_completed":0,"steps_total":0,"current_step":null,"plan":[]},"knowledge":{"discovered_facts":[],"sources":{},"key_concepts":[],"extra":{}},"workspace":{"files":{},"artifacts":[],"extra":{}},"extensions":{"step":2}},"schema":null,"extension_schemas":{},"max_changes":10000}', '8a7aad28365648f79a93e7ee090f86c1', 'task unpriced');
INSERT INTO __SCHEMA__.sessions VALUES ('idle', 'agent', '', 'active', '2026-11-23 15:09:37.589926+00', '2026-11-23 15:09:37.589926+00', '{}', 0, 0, 0, 0, NULL, 'ab193ced4bf84aeda13284532fb94420', 'task idle');
ALTER TABLE ONLY __SCHEMA__.entries
    ADD CONSTRAINT entries_pkey PRIMARY KEY (session_id, "position");
ALTER TABLE ONLY __SCHEMA__.environment_changes
    ADD CONSTRAINT environment_changes_pkey PRIMARY KEY (session_id, version);
ALTER TABLE ONLY __SCHEMA__.events
    ADD CONSTRAINT events_pkey PRIMARY KEY (session_id, "position");
ALTER TABLE ONLY __SCHEMA__.sessions
    ADD CONSTRAINT sessions_pkey PRIMARY KEY (id);
CREATE INDEX events_by_run ON __SCHEMA__.events USING btree (session_id, run_id, seq);
CREATE INDEX sessions_by_update ON __SCHEMA__.sessions USING btree (updated_at DESC, id);
ALTER TABLE ONLY __SCHEMA__.entries
    ADD CONSTRAINT entries_session_id_fkey FOREIGN KEY (session_id) REFERENCES __SCHEMA__.sessions(id) ON DELETE CASCADE;
ALTER TABLE ONLY __SCHEMA__.environment_changes
    ADD CONSTRAINT environment_changes_session_id_fkey FOREIGN KEY (session_id) REFERENCES __SCHEMA__.sessions(id) ON DELETE CASCADE;
ALTER TABLE ONLY __SCHEMA__.events
    ADD CONSTRAINT events_session_id_fkey FOREIGN KEY (session_id) REFERENCES __SCHEMA__.sessions(id) ON DELETE CASCADE;
