"""Property test of the file tree against a reference model of the access rules.

A seeded random driver has four users in two tenants create, upload, move, rename, share,
unshare, delete and restore, sometimes several at once. A plain-Python model of the rules
(README "Access rules") predicts each sequential call's outcome (status code) and the tree
after it. After every step: no call answered INTERNAL/UNKNOWN, the outcome matches the
model; every few steps (and after each concurrent burst) the server's tree is read back as
each item's owner and must equal the model, have no cycle, and every user's GetFile role on
every item and a listing must equal the model's. A failure prints the seed and step.

More: SERENTAK_TREE_PROPERTY_SEEDS=3,4,5,6 SERENTAK_TREE_PROPERTY_STEPS=200 (each seed ~15-30 s).
"""

from __future__ import annotations

import asyncio
import os
import random
import unicodedata
from collections import Counter
from dataclasses import dataclass, field

import grpc
import pytest
from serentak.upload.v1 import upload_pb2
from upload.upload_helpers import chunk_request, create_request, wait_status

USERS = {"alice": "acme", "bob": "acme", "carol": "acme", "mallory": "evil"}
NAMES = ["a", "b", "café", "cafe\u0301", "notes.txt"]
OK = grpc.StatusCode.OK
NOT_FOUND = grpc.StatusCode.NOT_FOUND
DENIED = grpc.StatusCode.PERMISSION_DENIED
EXISTS = grpc.StatusCode.ALREADY_EXISTS
INVALID = grpc.StatusCode.INVALID_ARGUMENT
PRECONDITION = grpc.StatusCode.FAILED_PRECONDITION
RANK = {None: 0, "viewer": 1, "editor": 2, "owner": 3}
ROLE_OF_PB = {
    upload_pb2.ROLE_VIEWER: "viewer",
    upload_pb2.ROLE_EDITOR: "editor",
    upload_pb2.ROLE_OWNER: "owner",
}
PB_OF_ROLE = {"viewer": upload_pb2.ROLE_VIEWER, "editor": upload_pb2.ROLE_EDITOR}
STEPS = int(os.environ.get("SERENTAK_TREE_PROPERTY_STEPS", "150"))
SEEDS = [int(s) for s in os.environ.get("SERENTAK_TREE_PROPERTY_SEEDS", "1,2").split(",")]


@dataclass
class Item:
    tenant: str
    owner: str
    parent: str | None
    name: str
    folder: bool
    deleted: bool = False


@dataclass
class Model:
    """The access rules, written as plainly as possible."""

    items: dict[str, Item] = field(default_factory=dict)
    shares: dict[tuple[str, str], str] = field(default_factory=dict)

    def role(self, user: str, item_id: str) -> str | None:
        item = self.items[item_id]
        if USERS[user] != item.tenant:
            return None
        if item.owner == user:
            return "owner"
        best: str | None = None
        current: str | None = item_id
        while current is not None and self.items[current].owner == item.owner:
            share = self.shares.get((current, user))
            if RANK[share] > RANK[best]:
                best = share
            current = self.items[current].parent
        return best

    def live_holder(self, parent: str, name: str, except_id: str = "") -> str | None:
        for item_id, item in self.items.items():
            if item.parent == parent and item.name == name and not item.deleted:
                if item_id != except_id:
                    return item_id
        return None

    def ancestors(self, item_id: str) -> list[str]:
        seen: list[str] = []
        current = self.items[item_id].parent
        while current is not None:
            assert current not in seen, f"cycle through {current}"
            seen.append(current)
            current = self.items[current].parent
        return seen

    def write_check(self, user: str, item_id: str) -> grpc.StatusCode | None:
        role = self.role(user, item_id)
        if role is None:
            return NOT_FOUND
        if RANK[role] < RANK["editor"]:
            return DENIED
        return None


class Driver:
    """Runs random steps against the cluster and the model side by side."""

    def __init__(self, cluster, seed: int) -> None:
        self.cluster = cluster
        self.rng = random.Random(seed)
        self.model = Model()
        self.roots: dict[str, str] = {}
        self.seed = seed
        self.step = 0
        self.outcomes: Counter[tuple[str, str]] = Counter()

    def client(self, user: str):
        return self.cluster[user]

    async def call(self, user: str, method: str, request):
        """(status code, response); fails on INTERNAL/UNKNOWN."""
        client = self.client(user)
        service = client.uploads if method == "CreateUpload" else client.files
        try:
            response = await getattr(service, method)(request, metadata=client.metadata)
            self.outcomes[(method, OK.name)] += 1
            return OK, response
        except grpc.aio.AioRpcError as exc:
            self.outcomes[(method, exc.code().name)] += 1
            assert exc.code() not in (grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN), (
                self.where(f"{method} answered {exc.code()}: {exc.details()}")
            )
            return exc.code(), None

    def where(self, message: str) -> str:
        return f"seed {self.seed} step {self.step}: {message}"

    def expect(self, got: grpc.StatusCode, want: grpc.StatusCode, what: str) -> None:
        assert got == want, self.where(f"{what}: got {got.name}, model says {want.name}")

    async def setup(self) -> None:
        for user, tenant in USERS.items():
            code, made = await self.call(
                user, "CreateFolder", upload_pb2.CreateFolderRequest(name="home")
            )
            assert code == OK
            self.roots[user] = made.parent_id
            self.model.items[made.parent_id] = Item(tenant, user, None, "", True)
            self.model.items[made.file_id] = Item(tenant, user, made.parent_id, "home", True)

    # --- the operations: each predicts its outcome with the model, then applies it ---

    def pick_item(
        self, *, folder: bool | None = None, roots: bool = False, user: str | None = None
    ) -> str:
        """A random item; for `user`, mostly one they can write (so calls get past NOT_FOUND)."""
        ids = [
            i
            for i, item in self.model.items.items()
            if (folder is None or item.folder == folder) and (roots or item.parent is not None)
        ]
        if user is not None and self.rng.random() < 0.8:
            writable = [i for i in ids if RANK[self.model.role(user, i)] >= RANK["editor"]]
            if writable:
                return self.rng.choice(writable)
        return self.rng.choice(ids)

    def pick_user(self) -> str:
        # Mostly acme users (they share with each other); mallory probes across tenants.
        return self.rng.choice(["alice", "alice", "bob", "bob", "carol", "mallory"])

    async def create_folder(self, user: str) -> None:
        parent = self.pick_item(folder=True, roots=True, user=user)
        name = self.rng.choice(NAMES)
        want = self.create_outcome(user, parent, name)
        code, made = await self.call(
            user, "CreateFolder", upload_pb2.CreateFolderRequest(name=name, parent_id=parent)
        )
        self.expect(code, want, f"{user} CreateFolder {name!r} in {parent}")
        if code == OK:
            p = self.model.items[parent]
            self.model.items[made.file_id] = Item(p.tenant, p.owner, parent, made.name, True)

    def create_outcome(self, user: str, parent: str, name: str) -> grpc.StatusCode:
        m = self.model
        refused = m.write_check(user, parent)
        if refused:
            return refused
        if m.items[parent].deleted:
            return PRECONDITION
        if m.live_holder(parent, unicodedata.normalize("NFC", name)):
            return EXISTS
        return OK

    async def upload(self, user: str) -> None:
        parent = self.pick_item(folder=True, roots=True, user=user)
        name = self.rng.choice(NAMES)
        want = self.create_outcome(user, parent, name)
        code, made = await self.call(
            user, "CreateUpload", create_request(b"x" * 10, 1024, name=name, folder_id=parent)
        )
        self.expect(code, want, f"{user} CreateUpload {name!r} in {parent}")
        if code != OK:
            return
        client = self.client(user)
        await client.uploads.PutChunk(
            chunk_request(made.upload_id, 0, b"x" * 10), metadata=client.metadata
        )
        done = await wait_status(client, made.upload_id, upload_pb2.UPLOAD_STATUS_COMPLETED)
        p = self.model.items[parent]
        self.model.items[done.file_id] = Item(
            p.tenant, p.owner, parent, unicodedata.normalize("NFC", name), False
        )

    async def rename(self, user: str) -> None:
        target = self.pick_item(user=user)
        name = unicodedata.normalize("NFC", self.rng.choice(NAMES))
        m, item = self.model, self.model.items[target]
        want = m.write_check(user, target) or (
            EXISTS if not item.deleted and m.live_holder(item.parent or "", name, target) else OK
        )
        code, _ = await self.call(
            user, "RenameFile", upload_pb2.RenameFileRequest(file_id=target, new_name=name)
        )
        self.expect(code, want, f"{user} RenameFile {target} to {name!r}")
        if code == OK:
            item.name = name

    def move_outcome(self, user: str, target: str, dest: str) -> grpc.StatusCode:
        m = self.model
        item, folder = m.items[target], m.items[dest]
        refused = m.write_check(user, target)
        if refused:
            return refused
        if item.parent is None:
            return INVALID
        refused = m.write_check(user, dest)
        if refused:
            return refused
        if not folder.folder or folder.deleted:
            return PRECONDITION
        if m.role(user, target) != "owner" and folder.owner != item.owner:
            return DENIED
        if dest == target or target in m.ancestors(dest):
            return INVALID
        if not item.deleted and m.live_holder(dest, item.name, target):
            return EXISTS
        return OK

    async def move(self, user: str) -> None:
        target = self.pick_item(roots=self.rng.random() < 0.05, user=user)
        dest = self.pick_item(folder=self.rng.random() < 0.9 or None, roots=True, user=user)
        want = self.move_outcome(user, target, dest)
        code, _ = await self.call(
            user, "MoveFile", upload_pb2.MoveFileRequest(file_id=target, new_parent_id=dest)
        )
        self.expect(code, want, f"{user} MoveFile {target} into {dest}")
        if code == OK:
            self.model.items[target].parent = dest

    async def delete(self, user: str) -> None:
        target = self.pick_item(roots=self.rng.random() < 0.05, user=user)
        m, item = self.model, self.model.items[target]
        role = m.role(user, target)
        if role is None:
            want = NOT_FOUND
        elif item.deleted:
            want = PRECONDITION
        elif item.parent is None:
            want = INVALID
        else:
            want = m.write_check(user, target) or OK
        code, _ = await self.call(user, "DeleteFile", upload_pb2.DeleteFileRequest(file_id=target))
        self.expect(code, want, f"{user} DeleteFile {target}")
        if code == OK:
            item.deleted = True

    async def restore(self, user: str) -> None:
        deleted = [i for i, it in self.model.items.items() if it.deleted]
        if not deleted:
            return
        target = self.rng.choice(deleted)
        m, item = self.model, self.model.items[target]
        want = m.write_check(user, target) or (
            EXISTS if m.live_holder(item.parent or "", item.name, target) else OK
        )
        code, _ = await self.call(
            user, "RestoreFile", upload_pb2.RestoreFileRequest(file_id=target)
        )
        self.expect(code, want, f"{user} RestoreFile {target}")
        if code == OK:
            item.deleted = False

    async def share(self, user: str) -> None:
        target = self.pick_item(roots=True, user=user)
        other = self.rng.choice([u for u in USERS if u != user])
        role = self.rng.choice(["viewer", "editor"])
        mine = self.model.role(user, target)
        want = NOT_FOUND if mine is None else OK if mine == "owner" else DENIED
        code, _ = await self.call(
            user,
            "ShareFile",
            upload_pb2.ShareFileRequest(file_id=target, user_id=other, role=PB_OF_ROLE[role]),
        )
        self.expect(code, want, f"{user} ShareFile {target} with {other} as {role}")
        if code == OK:
            self.model.shares[(target, other)] = role

    async def unshare(self, user: str) -> None:
        if not self.model.shares or self.rng.random() < 0.2:
            target, other = self.pick_item(roots=True), self.rng.choice(list(USERS))
        else:
            target, other = self.rng.choice(sorted(self.model.shares))
        if other == user:
            return
        mine = self.model.role(user, target)
        want = NOT_FOUND if mine is None else DENIED if mine != "owner" else OK
        if want == OK and (target, other) not in self.model.shares:
            want = NOT_FOUND
        code, _ = await self.call(
            user, "UnshareFile", upload_pb2.UnshareFileRequest(file_id=target, user_id=other)
        )
        self.expect(code, want, f"{user} UnshareFile {target} from {other}")
        if code == OK:
            del self.model.shares[(target, other)]

    async def burst(self) -> None:
        """Moves and creates at once (racing moves included); then the model is re-read."""
        calls = []
        for _ in range(self.rng.randint(2, 4)):
            user = self.rng.choice(["alice", "bob"])
            if self.rng.random() < 0.7:
                a = self.pick_item(folder=True, user=user)
                b = self.pick_item(folder=True, user=user)
                calls.append(
                    self.call(
                        user, "MoveFile", upload_pb2.MoveFileRequest(file_id=a, new_parent_id=b)
                    )
                )
                calls.append(
                    self.call(
                        user, "MoveFile", upload_pb2.MoveFileRequest(file_id=b, new_parent_id=a)
                    )
                )
            else:
                parent = self.pick_item(folder=True, roots=True, user=user)
                calls.append(
                    self.call(
                        user,
                        "CreateFolder",
                        upload_pb2.CreateFolderRequest(name="x", parent_id=parent),
                    )
                )
        for code, made in await asyncio.gather(*calls):
            if code == OK and made.file_id not in self.model.items:
                self.model.items[made.file_id] = Item(
                    made.tenant_id, made.owner_user_id, made.parent_id, made.name, True
                )
        await self.resync()

    # --- checks ---

    async def resync(self) -> None:
        """Take parents/names/deleted from the server (as each item's owner)."""
        for item_id, item in self.model.items.items():
            code, found = await self.call(
                item.owner, "GetFile", upload_pb2.GetFileRequest(file_id=item_id)
            )
            assert code == OK, self.where(f"owner {item.owner} cannot read {item_id}")
            item.parent, item.name, item.deleted = (
                found.parent_id or None,
                found.name,
                found.deleted,
            )
        for item_id in self.model.items:
            self.model.ancestors(item_id)  # no cycle

    async def check_all(self) -> None:
        """The server's tree equals the model's; every user's role on every item too."""
        expected = {i: (it.parent, it.name, it.deleted) for i, it in self.model.items.items()}
        await self.resync()
        actual = {i: (it.parent, it.name, it.deleted) for i, it in self.model.items.items()}
        assert actual == expected, self.where("the server's tree differs from the model's")
        for user in USERS:
            for item_id in self.model.items:
                code, found = await self.call(
                    user, "GetFile", upload_pb2.GetFileRequest(file_id=item_id)
                )
                want = self.model.role(user, item_id)
                got = ROLE_OF_PB[found.role] if code == OK else None
                assert got == want, self.where(f"{user} on {item_id}: role {got}, model {want}")
        user = self.pick_user()
        folder = self.pick_item(folder=True, roots=True)
        code, page = await self.call(
            user, "ListFolder", upload_pb2.ListFolderRequest(folder_id=folder, page_size=1000)
        )
        if self.model.role(user, folder) is None:
            self.expect(code, NOT_FOUND, f"{user} ListFolder {folder}")
            return
        self.expect(code, OK, f"{user} ListFolder {folder}")
        seen = {f.file_id: ROLE_OF_PB[f.role] for f in page.files}
        entries = {
            i: self.model.role(user, i)
            for i, it in self.model.items.items()
            if it.parent == folder and not it.deleted and self.model.role(user, i)
        }
        assert seen == entries, self.where(f"{user} lists {folder}: {seen} != model {entries}")

    async def run(self, steps: int) -> None:
        await self.setup()
        ops = [
            (self.create_folder, 5),
            (self.upload, 1),
            (self.move, 6),
            (self.rename, 3),
            (self.share, 4),
            (self.unshare, 2),
            (self.delete, 2),
            (self.restore, 2),
        ]
        funcs, weights = zip(*ops, strict=True)
        for self.step in range(steps):
            if self.rng.random() < 0.08:
                await self.burst()
            else:
                op = self.rng.choices(funcs, weights)[0]
                await op(self.pick_user())
            if self.step % 10 == 9:
                await self.check_all()
        await self.check_all()
        # The run exercised both sides of the rules (not only refusals, not only successes).
        for method in ("MoveFile", "ShareFile", "CreateFolder"):
            assert self.outcomes[(method, "OK")] > 0, self.outcomes
        refusals = {code for (_, code) in self.outcomes if code != "OK"}
        assert {"NOT_FOUND", "PERMISSION_DENIED", "ALREADY_EXISTS"} <= refusals, self.outcomes
        print(f"seed {self.seed}: {sorted(self.outcomes.items())}")


@pytest.mark.parametrize("seed", SEEDS)
async def test_random_tree_operations_follow_the_access_rules(cluster, seed: int) -> None:
    await Driver(cluster, seed).run(STEPS)
