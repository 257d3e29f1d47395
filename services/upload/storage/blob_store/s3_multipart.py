"""S3 multipart uploads driven step by step, so each one can be recorded while it runs.

obstore uploads a big object as a multipart upload of its own and never says its upload id;
a process killed mid-upload leaves parts that no listing of objects shows and that nothing
could name to abort. So the merge makes the calls itself (CreateMultipartUpload, UploadPart,
CompleteMultipartUpload, AbortMultipartUpload; ListMultipartUploads for the sweep's second
net), each one HTTP request signed with AWS Signature V4 (static keys from the settings;
the signing is the documented algorithm, ~40 lines, rather than a second S3 SDK).

Without static keys (obstore's AWS chain: web identity, instance metadata) there is no
`S3Multipart` and merges go through obstore's multipart, unrecorded (the S3 store logs it
at start): a bucket lifecycle rule (AbortIncompleteMultipartUpload) is then the only net.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import ssl
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from urllib.parse import quote, urlsplit

import httpx

from services.upload.settings import UploadSettings

# Parts hashed (SigV4 payload hash) off the event loop above this size; hashlib releases
# the GIL for large buffers.
_THREAD_FROM = 256 * 1024
_EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()
_TIMEOUT = httpx.Timeout(60.0, connect=5.0)


class S3RequestFailed(Exception):
    """An S3 request answered with an error (`status`, S3's error `code`) or not at all."""

    def __init__(self, operation: str, status: int, code: str, message: str = "") -> None:
        super().__init__(f"{operation}: HTTP {status} {code} {message}".strip())
        self.operation = operation
        self.status = status
        self.code = code


@dataclass(frozen=True, slots=True)
class InProgress:
    """One unfinished multipart upload a listing found (the store's key, no prefix)."""

    key: str
    upload_id: str
    initiated: datetime


@dataclass(frozen=True, slots=True)
class S3Location:
    """Where the bucket is and how requests to it are signed."""

    endpoint: str  # scheme://host[:port]
    bucket: str
    prefix: str  # "" or "a/b" (no slashes at the ends)
    region: str
    path_style: bool
    access_key_id: str
    secret_access_key: str


def _local(tag: str) -> str:
    return tag.rsplit("}", 1)[-1]


def _children(element: ET.Element, name: str) -> list[ET.Element]:
    return [e for e in element if _local(e.tag) == name]


def _text(element: ET.Element, name: str) -> str:
    found = _children(element, name)
    return (found[0].text or "") if found else ""


def _error(operation: str, response: httpx.Response) -> S3RequestFailed:
    code, message = "", ""
    try:
        root = ET.fromstring(response.content)
        code, message = _text(root, "Code"), _text(root, "Message")
    except ET.ParseError:
        pass
    return S3RequestFailed(operation, response.status_code, code, message[:200])


def _sign(key: bytes, text: str) -> bytes:
    return hmac.new(key, text.encode(), hashlib.sha256).digest()


def _encode(value: str, safe: str = "-_.~") -> str:
    return quote(value, safe=safe)


class S3Multipart:
    """The multipart calls on one bucket under one key prefix (keys are the store's)."""

    def __init__(
        self,
        location: S3Location,
        client: httpx.AsyncClient | None = None,
        *,
        trust: ssl.SSLContext | None = None,
    ) -> None:
        self._at = location
        # `trust`: a private CA's context (private_ca.py); default: the system's roots.
        self._client = client or httpx.AsyncClient(
            timeout=_TIMEOUT, verify=trust if trust is not None else True
        )
        parts = urlsplit(location.endpoint)
        self._scheme = parts.scheme or "https"
        self._host = parts.netloc if location.path_style else f"{location.bucket}.{parts.netloc}"
        self._base_path = parts.path.rstrip("/") + (
            f"/{location.bucket}" if location.path_style else ""
        )

    def full_key(self, key: str) -> str:
        """The bucket key of the store's `key` (with the prefix)."""
        return f"{self._at.prefix}/{key}" if self._at.prefix else key

    def _store_key(self, full: str) -> str:
        prefix = f"{self._at.prefix}/" if self._at.prefix else ""
        return full[len(prefix) :] if full.startswith(prefix) else full

    async def _request(
        self,
        operation: str,
        method: str,
        key: str | None,
        params: Sequence[tuple[str, str]],
        body: bytes = b"",
    ) -> httpx.Response:
        """One SigV4-signed request; an error answer raises S3RequestFailed."""
        path = self._base_path + ("/" + _encode(self.full_key(key), "/-_.~") if key else "/")
        query = "&".join(f"{_encode(k)}={_encode(v)}" for k, v in sorted(params))
        if len(body) >= _THREAD_FROM:
            payload = await asyncio.to_thread(lambda: hashlib.sha256(body).hexdigest())
        else:
            payload = hashlib.sha256(body).hexdigest() if body else _EMPTY_SHA256
        now = datetime.now(UTC)
        stamp, day = now.strftime("%Y%m%dT%H%M%SZ"), now.strftime("%Y%m%d")
        headers = {"host": self._host, "x-amz-content-sha256": payload, "x-amz-date": stamp}
        signed = ";".join(sorted(headers))
        canonical = "\n".join(
            [
                method,
                path,
                query,
                "".join(f"{name}:{headers[name]}\n" for name in sorted(headers)),
                signed,
                payload,
            ]
        )
        scope = f"{day}/{self._at.region}/s3/aws4_request"
        to_sign = "\n".join(
            ["AWS4-HMAC-SHA256", stamp, scope, hashlib.sha256(canonical.encode()).hexdigest()]
        )
        key_bytes = _sign(("AWS4" + self._at.secret_access_key).encode(), day)
        for part in (self._at.region, "s3", "aws4_request"):
            key_bytes = _sign(key_bytes, part)
        signature = hmac.new(key_bytes, to_sign.encode(), hashlib.sha256).hexdigest()
        headers["authorization"] = (
            f"AWS4-HMAC-SHA256 Credential={self._at.access_key_id}/{scope}, "
            f"SignedHeaders={signed}, Signature={signature}"
        )
        url = f"{self._scheme}://{self._host}{path}" + (f"?{query}" if query else "")
        try:
            response = await self._client.request(method, url, headers=headers, content=body)
        except httpx.HTTPError as exc:
            raise S3RequestFailed(operation, 0, type(exc).__name__, str(exc)[:200]) from exc
        if response.status_code >= 300:
            raise _error(operation, response)
        return response

    async def create(self, key: str) -> str:
        """CreateMultipartUpload of `key`; its upload id."""
        response = await self._request("create multipart", "POST", key, [("uploads", "")])
        upload_id = _text(ET.fromstring(response.content), "UploadId")
        if not upload_id:
            raise S3RequestFailed("create multipart", response.status_code, "NoUploadId")
        return upload_id

    async def upload_part(self, key: str, upload_id: str, number: int, data: bytes) -> str:
        """UploadPart `number` (from 1); its ETag."""
        params = [("partNumber", str(number)), ("uploadId", upload_id)]
        response = await self._request("upload part", "PUT", key, params, data)
        return str(response.headers.get("etag", ""))

    async def complete(self, key: str, upload_id: str, etags: Sequence[str]) -> None:
        """CompleteMultipartUpload: `key` becomes the parts, in order, all at once."""
        parts = "".join(
            f"<Part><PartNumber>{n}</PartNumber><ETag>{etag}</ETag></Part>"
            for n, etag in enumerate(etags, start=1)
        )
        body = f"<CompleteMultipartUpload>{parts}</CompleteMultipartUpload>".encode()
        response = await self._request(
            "complete multipart", "POST", key, [("uploadId", upload_id)], body
        )
        # S3 may answer 200 and still fail: the error is then the body.
        root = ET.fromstring(response.content) if response.content else None
        if root is not None and _local(root.tag) == "Error":
            raise S3RequestFailed(
                "complete multipart",
                response.status_code,
                _text(root, "Code"),
                _text(root, "Message"),
            )

    async def abort(self, key: str, upload_id: str) -> bool:
        """AbortMultipartUpload: its parts deleted. False: S3 no longer knows the upload
        (aborted or completed already), which is as good."""
        try:
            await self._request("abort multipart", "DELETE", key, [("uploadId", upload_id)])
        except S3RequestFailed as exc:
            if exc.status == 404:
                return False
            raise
        return True

    async def list_in_progress(self, prefix: str) -> list[InProgress]:
        """ListMultipartUploads under the store's `prefix` (every page). Raises
        S3RequestFailed (501 NotImplemented on servers without it, such as s3s-fs)."""
        found: list[InProgress] = []
        markers: list[tuple[str, str]] = []
        while True:
            params = [("uploads", ""), ("prefix", self.full_key(prefix)), *markers]
            response = await self._request("list multipart", "GET", None, params)
            root = ET.fromstring(response.content)
            for upload in _children(root, "Upload"):
                initiated = datetime.fromisoformat(
                    _text(upload, "Initiated").replace("Z", "+00:00")
                )
                found.append(
                    InProgress(
                        self._store_key(_text(upload, "Key")), _text(upload, "UploadId"), initiated
                    )
                )
            if _text(root, "IsTruncated") != "true":
                return found
            markers = [
                ("key-marker", _text(root, "NextKeyMarker")),
                ("upload-id-marker", _text(root, "NextUploadIdMarker")),
            ]

    async def close(self) -> None:
        """Close the HTTP connections."""
        await self._client.aclose()


def location_of(settings: UploadSettings, bucket: str, prefix: str | None) -> S3Location | None:
    """The location from UploadSettings; None without static keys (module docstring)."""
    secret = settings.s3_secret_access_key
    if not settings.s3_access_key_id or secret is None:
        return None
    endpoint = settings.s3_endpoint or f"https://s3.{settings.s3_region}.amazonaws.com"
    return S3Location(
        endpoint=endpoint,
        bucket=bucket,
        prefix=(prefix or "").strip("/"),
        region=settings.s3_region,
        path_style=settings.s3_path_style,
        access_key_id=settings.s3_access_key_id,
        secret_access_key=secret.get_secret_value(),
    )
