"""The Serentak locks service."""
