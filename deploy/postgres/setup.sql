-- PostgreSQL for PEEP server replicas (storage.backend = "postgres").
-- Run as a superuser:  psql -v pw="'$(cat /etc/peep/credentials/db-password)'" -f deploy/postgres/setup.sql
-- The server applies its own schema migrations at start-up (table peep_schema),
-- under an advisory lock, so replicas starting together are safe.

CREATE ROLE "peep-server" LOGIN PASSWORD :pw;
CREATE DATABASE peep OWNER "peep-server" ENCODING 'UTF8' TEMPLATE template0;
\connect peep
-- Nobody else reads templates: revoke the default PUBLIC rights.
REVOKE ALL ON DATABASE peep FROM PUBLIC;
REVOKE ALL ON SCHEMA public FROM PUBLIC;
GRANT ALL ON SCHEMA public TO "peep-server";
