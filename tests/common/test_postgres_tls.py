"""PostgreSQL TLS settings travel in the database URL (`sslmode`, `sslrootcert`) and reach
psycopg through `services.common.db.create_engine` untouched (PostgreSQL only: SQLite has
no network to protect)."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import OperationalError
from support.pki import Pki

from services.common.db import create_engine


async def _uses_ssl(url: str) -> bool:
    engine = create_engine(url, pool_size=1)
    try:
        async with engine.connect() as conn:
            row = await conn.execute(
                text("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()")
            )
            return bool(row.scalar_one())
    finally:
        await engine.dispose()


def _with(url: str, **query: str) -> str:
    return make_url(url).update_query_dict(query).render_as_string(hide_password=False)


async def test_sslmode_and_sslrootcert_reach_the_driver(postgres, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    url = postgres.create()
    if not await _uses_ssl(_with(url, sslmode="prefer")):
        pytest.skip("this PostgreSQL server has ssl = off")
    assert await _uses_ssl(_with(url, sslmode="require"))
    assert not await _uses_ssl(_with(url, sslmode="disable"))
    # verify-full against a CA that did not sign the server's certificate: refused, so
    # sslrootcert is honoured (not silently ignored).
    stranger = Pki(tmp_path / "pki", name="stranger")
    with pytest.raises(OperationalError, match="certificate"):
        await _uses_ssl(_with(url, sslmode="verify-full", sslrootcert=str(stranger.ca)))
