#!/usr/bin/env bash
# `make test`: the Rust crate's tests, then the whole pytest suite against real etcd and
# PostgreSQL. Uses SERENTAK_TEST_PG_DSN when set (CI sets it); otherwise starts the
# machine's PostgreSQL cluster when one is installed.
set -euo pipefail
cd "$(dirname "$0")/../.."

if [ -z "${SERENTAK_TEST_PG_DSN:-}" ] && command -v pg_lsclusters >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
  SERENTAK_TEST_PG_DSN="$(bash deploy/local/postgres.sh)"
  export SERENTAK_TEST_PG_DSN
fi
echo "PostgreSQL for tests: ${SERENTAK_TEST_PG_DSN:-<none: PostgreSQL tests skip outside CI>}"

(cd merge_core && cargo test -q)
exec .venv/bin/python -m pytest "$@"
