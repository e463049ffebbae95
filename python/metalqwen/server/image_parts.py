"""The images of a chat request: OpenAI ``image_url`` content parts, resolved to decoded pictures
under the server's policy (docs/server.md, "Images"). ``data:`` URLs always; local files only
under ``--allowed-image-dir``; http(s) only with ``--fetch-images``. Every refusal names the part
at fault (``messages[0].content[1].image_url.url``)."""

from __future__ import annotations

import io
import os
from dataclasses import dataclass
from typing import Any, Sequence

from ..images import image_from_url


class ImageRefused(ValueError):
    """A request's image the server will not take (HTTP 400, ``param`` the field at fault)."""

    def __init__(self, message: str, param: str):
        super().__init__(f"{param}: {message}")
        self.param = param


@dataclass(frozen=True)
class ImagePolicy:
    """What the server takes. ``max_pixels`` bounds an image as sent (width × height before the
    processor's resize, so a decompression bomb is refused from its header); ``fetch_bytes`` and
    ``fetch_seconds`` bound an http(s) download."""
    allowed_dir: str | None = None
    fetch: bool = False
    max_images: int = 8
    max_pixels: int = 40_000_000
    fetch_bytes: int = 20 * 1024 * 1024
    fetch_seconds: float = 10.0


def _url_of(part: dict, where: str) -> str:
    url = part.get("image_url")
    url = url.get("url") if isinstance(url, dict) else url
    if not isinstance(url, str) or not url:
        raise ImageRefused("an image_url part needs image_url.url (a data:, file:// or http(s) URL)", where + ".url")
    return url


def _local(url: str, policy: ImagePolicy, where: str) -> str:
    """The real path of a file:// URL (or plain path), inside the allowed directory after symlinks."""
    if policy.allowed_dir is None:
        raise ImageRefused("local image files are not served (start the server with --allowed-image-dir DIR)",
                           where)
    path = os.path.realpath(url[len("file://"):] if url.startswith("file://") else url)
    root = os.path.realpath(policy.allowed_dir)
    if os.path.commonpath([path, root]) != root:
        raise ImageRefused(f"{path} is outside the allowed image directory", where)
    if not os.path.isfile(path):
        raise ImageRefused(f"{path} is not a file", where)
    return path


def _fetch(url: str, policy: ImagePolicy, where: str) -> bytes:
    """An http(s) image's bytes, at most fetch_bytes, within fetch_seconds."""
    if not policy.fetch:
        raise ImageRefused("http(s) image URLs are not fetched (start the server with --fetch-images)", where)
    import httpx

    try:
        with httpx.stream("GET", url, timeout=policy.fetch_seconds, follow_redirects=True) as r:
            if r.status_code != 200:
                raise ImageRefused(f"fetching {url[:80]} answered HTTP {r.status_code}", where)
            data = bytearray()
            for piece in r.iter_bytes():
                data += piece
                if len(data) > policy.fetch_bytes:
                    raise ImageRefused(f"{url[:80]} is larger than {policy.fetch_bytes} bytes", where)
            return bytes(data)
    except httpx.HTTPError as e:
        raise ImageRefused(f"fetching {url[:80]} failed: {type(e).__name__}: {e}", where) from None


def decode(url: str, policy: ImagePolicy, where: str):
    """The picture (PIL RGB) an image_url's URL gives, checked against the policy."""
    from PIL import Image

    if url.startswith(("http://", "https://")):
        source = _fetch(url, policy, where)
    elif url.startswith("data:"):
        try:
            source = image_from_url(url)
        except ValueError as e:
            raise ImageRefused(str(e).removeprefix("[images] "), where) from None
    else:
        source = _local(url, policy, where)
    try:
        with Image.open(io.BytesIO(source) if isinstance(source, bytes) else source) as im:
            if im.width * im.height > policy.max_pixels:  # read from the header, before decoding
                raise ImageRefused(f"the image is {im.width} x {im.height} pixels, more than the "
                                   f"{policy.max_pixels} the server takes", where)
            return im.convert("RGB")
    except ImageRefused:
        raise
    except Image.DecompressionBombError as e:  # Pillow's own bound, met first when max_pixels is above it
        raise ImageRefused(f"the image has too many pixels to decode safely ({e})", where) from None
    except Exception as e:  # PIL raises several kinds for data that is not a picture
        raise ImageRefused(f"not a decodable image ({type(e).__name__}: {e})", where) from None


def resolve(messages: Sequence[Any], policy: ImagePolicy) -> list:
    """The request's messages (dicts) with each image_url part's URL replaced by its picture
    (``{"type": "image", "image": picture}``), in order; raises ImageRefused."""
    count = sum(1 for m in messages if isinstance(m.get("content"), list)
                for p in m["content"] if p.get("type") == "image_url")
    if count > policy.max_images:
        raise ImageRefused(f"{count} images exceed the {policy.max_images} a request may carry "
                           f"(--max-images)", "messages")
    out = []
    for i, m in enumerate(messages):
        content = m.get("content")
        if isinstance(content, list):
            parts = []
            for j, part in enumerate(content):
                if part.get("type") == "image_url":
                    where = f"messages[{i}].content[{j}].image_url"
                    part = {"type": "image", "image": decode(_url_of(part, where), policy, where + ".url")}
                parts.append(part)
            m = {**m, "content": parts}
        out.append(m)
    return out
