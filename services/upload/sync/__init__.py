"""Upstream sync: keep files linked to a storage provider (Graph-style) in step with it.

A 410 Gone on an item is terminal (tombstone), a 404 is a bounded retry, 429/503 honour
Retry-After, and a 410 on a delta cursor only means "re-enumerate" (DESIGN.md invariant 14).
Sync sits above the file tree: it imports the tree, never the other way round; the tree hides
tombstoned files through the rule registered below (`files.visibility`).
"""

from services.upload.files import visibility
from services.upload.sync.tombstones import TOMBSTONES

# Whoever can tombstone a file has imported this package: from then on the tree hides them.
visibility.register(TOMBSTONES)
