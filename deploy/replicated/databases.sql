-- The databases and their owner (docs/deploy-replicated.md), run by a superuser:
--   psql ADMIN_URL -v ON_ERROR_STOP=1 -v owner=serentak -v password=... -v prefix=serentak \
--        -f deploy/replicated/databases.sql
-- One database per service (each has its own job runtime tables), owned by the role the
-- services log in as; nobody else may connect.
CREATE ROLE :"owner" LOGIN PASSWORD :'password';
SELECT format('CREATE DATABASE %I OWNER %I', :'prefix' || '_' || service, :'owner'),
       format('REVOKE CONNECT, TEMPORARY ON DATABASE %I FROM PUBLIC', :'prefix' || '_' || service)
FROM (VALUES ('upload'), ('notify')) AS services(service) \gexec
