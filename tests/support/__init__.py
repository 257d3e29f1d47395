"""Test support: real etcd and PostgreSQL, and running Serentak services."""
