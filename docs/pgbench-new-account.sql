-- What PostgreSQL alone does for a new account's sign-in, for pgbench: three inserts (the
-- account, its session, an outbox row numbered from the outbox's top) and a commit, one round trip
-- each. Against the bench's or the tests' cluster, once:
--   psql "$URL" -c "CREATE TABLE b_account (uid text PRIMARY KEY, provider text, subject text,
--     created_at timestamptz, UNIQUE (provider, subject));
--     CREATE TABLE b_session (id bigserial PRIMARY KEY, token text UNIQUE, uid text,
--     created_at timestamptz, last_used_at timestamptz);
--     CREATE TABLE b_outbox (sequence bigint PRIMARY KEY, envelope text)"
-- then, for example:
--   pgbench "$URL" -n -c 1 -f docs/pgbench-new-account.sql -R 1000 -T 10 -r
\set n random(1, 1000000000)
BEGIN;
INSERT INTO b_account VALUES ('u' || :n || '-' || :client_id || random(), 'google', 's' || :n || random(), now())
  ON CONFLICT DO NOTHING;
INSERT INTO b_session (token, uid, created_at, last_used_at) VALUES (md5(random()::text), 'u' || :n, now(), now());
INSERT INTO b_outbox VALUES ((SELECT coalesce(max(sequence), 0) + 1 FROM b_outbox), '{"type":"auth.signedIn"}');
COMMIT;
