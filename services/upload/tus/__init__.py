"""tus 1.0 (tus.io): resumable uploads over HTTP for off-the-shelf clients (Uppy,
tus-js-client, tuspy, the mobile clients), beside the gRPC upload service, in its process.

Core protocol plus creation, creation-with-upload, creation-defer-length, checksum (sha1,
sha256, sha512, md5), termination, expiration and concatenation; OPTIONS discovery;
CORS. Every tus upload that makes a file is a Serentak upload (resources.py): the same
use cases, limits, quota, exactly-once merge, fencing, version and notifications.

How tus byte offsets meet Serentak's fixed-size chunks (pieces.py, tails.py): a tus
upload's Serentak upload has chunks of `tus_chunk_size`; a chunk is stored (ChunkStore)
the moment its bytes are complete, whichever requests they came in; the bytes of the
chunk still incomplete when a request ends (or is cut) are written to a durable tail on
local disk (fsync, atomic replace). Upload-Offset is stored chunks times the chunk size
plus the tail: always bytes on disk, at any byte, so a client resumes inside a chunk.

Modules: protocol (words and parsing), tails, pieces (the bridge), targets (the
CreateUpload a tus upload stands for), resources (the use cases), sweep (expiry),
request_locks, bodies (streamed or spooled), cors, http (handlers), server (the runner).
"""

from services.upload.tus.resources import TusUploads
from services.upload.tus.server import TusServer
from services.upload.tus.tails import Tails

__all__ = ["Tails", "TusServer", "TusUploads"]
