#!/usr/bin/env bash
# Make a local PostgreSQL answer on 127.0.0.1:${PGPORT:-5432} and print its admin DSN.
# Installs Debian's server when missing and we are root (CI runs on a clean machine).
# pg_ctl refuses to run as root; pg_ctlcluster (postgresql-common) does the right thing.
set -euo pipefail
PGPORT="${PGPORT:-5432}"
PGPASS="${SERENTAK_PG_PASSWORD:-serentak}"

if ! ls /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ]; then
    apt-get update -qq >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >&2
  else
    echo "postgres.sh: PostgreSQL is not installed and we are not root" >&2
    exit 1
  fi
fi

version="$(ls /usr/lib/postgresql | sort -V | tail -1)"
if ! pg_lsclusters -h | awk '{print $1" "$2}' | grep -q "^${version} main$"; then
  pg_createcluster "$version" main -p "$PGPORT" >&2
fi
if ! pg_lsclusters -h | awk -v v="$version" '$1==v && $2=="main" {print $4}' | grep -q online; then
  pg_ctlcluster "$version" main start >&2
fi
port="$(pg_lsclusters -h | awk -v v="$version" '$1==v && $2=="main" {print $3}')"
# Tests connect over TCP with a password; set it idempotently.
su postgres -c "psql -q -p $port -c \"ALTER USER postgres PASSWORD '$PGPASS'\"" >/dev/null
echo "postgresql://postgres:${PGPASS}@127.0.0.1:${port}/postgres"
