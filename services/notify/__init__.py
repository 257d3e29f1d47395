"""The Serentak notify service."""
