"""Serentak services: upload, locks, notify, and the runtime they share."""
