"""Deployment helpers: the local supervisor behind `make run`."""
