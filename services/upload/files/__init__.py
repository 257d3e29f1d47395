"""The file tree: folders and files, sharing, access rules, listings, versions, events.

Invariants kept here (docs/architecture.md):
6. every metadata change bumps the file's monotonic `version` and records its outbox event
   in the same transaction (`versions.bump`, `events`);
7. a commit under a lock carries its token, refused when lower than `last_lock_token`
   (`versions`, the one fencing check);
11. folder listings are cached under versioned keys, invalidated only after commit
   (`listing_cache`).
Who may do what is decided in one place, `permissions`; every use case asks it.

Face: `Files` (`use_cases`: the FileService's use cases), `permissions`, `versions`,
`events`, `tree`. The tree never imports sync: features that hide files register a rule
with `visibility`.
"""
