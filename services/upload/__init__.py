"""The Serentak upload service."""
