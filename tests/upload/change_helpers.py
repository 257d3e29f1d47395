"""Helpers for change feed tests: a user's view as the listings show it, and a client's
copy of it kept by applying ListChanges."""

from __future__ import annotations

from dataclasses import dataclass, field

from serentak.upload.v1 import upload_pb2

# What a client keeps of an item: enough to see every change the feed must report.
Item = tuple[str, str, int, int]


def item(f: upload_pb2.File) -> Item:
    """The fields compared between the feed's copy and the listings."""
    return (f.name, f.parent_id, f.version, f.role)


async def view(client) -> dict[str, Item]:
    """Everything the caller sees: ListFolder from its root and from each item shared with
    it, walked down (the caller's root folders themselves left out)."""
    seen: dict[str, Item] = {}
    folders = [""]
    token = ""
    while True:
        page = await client.files.ListSharedWithMe(
            upload_pb2.ListSharedWithMeRequest(page_token=token), metadata=client.metadata
        )
        for shared in page.items:
            if shared.file.parent_id:
                seen[shared.file.file_id] = item(shared.file)
            if shared.file.kind == upload_pb2.FILE_KIND_FOLDER:
                folders.append(shared.file.file_id)
        token = page.next_page_token
        if not token:
            break
    walked: set[str] = set()
    while folders:
        folder_id = folders.pop()
        if folder_id in walked:
            continue
        walked.add(folder_id)
        token = ""
        while True:
            listed = await client.files.ListFolder(
                upload_pb2.ListFolderRequest(folder_id=folder_id, page_token=token),
                metadata=client.metadata,
            )
            for f in listed.files:
                seen[f.file_id] = item(f)
                if f.kind == upload_pb2.FILE_KIND_FOLDER:
                    folders.append(f.file_id)
            token = listed.next_page_token
            if not token:
                break
    return seen


@dataclass
class FeedCopy:
    """A sync client's copy of one user's view, kept by ListChanges."""

    client: object
    cursor: str = ""
    state: dict[str, upload_pb2.File] = field(default_factory=dict)
    # Every change received, in order (kind, file id, removed).
    received: list[tuple[int, str, bool]] = field(default_factory=list)

    def apply(self, page: upload_pb2.ListChangesResponse) -> None:
        """Apply one answer: drop everything on a reset, then each change in order."""
        if page.reset:
            self.state.clear()
        for change in page.changes:
            self.received.append((change.kind, change.file_id, change.removed))
            if change.removed:
                self.state.pop(change.file_id, None)
            else:
                self.state[change.file_id] = change.file
        self.cursor = page.next_cursor

    async def page(self, page_size: int = 0, wait_ms: int = 0) -> upload_pb2.ListChangesResponse:
        """Fetch and apply the next page."""
        client = self.client
        got = await client.files.ListChanges(  # type: ignore[attr-defined]
            upload_pb2.ListChangesRequest(cursor=self.cursor, page_size=page_size, wait_ms=wait_ms),
            metadata=client.metadata,  # type: ignore[attr-defined]
        )
        self.apply(got)
        return got

    async def catch_up(self, page_size: int = 0) -> list[upload_pb2.ListChangesResponse]:
        """Fetch pages until no more changes are ready."""
        pages = []
        while True:
            got = await self.page(page_size)
            pages.append(got)
            if not got.has_more:
                return pages

    def items(self) -> dict[str, Item]:
        """The copy in the listings' terms (root folders left out)."""
        return {i: item(f) for i, f in self.state.items() if f.parent_id}
