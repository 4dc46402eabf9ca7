"""Images in training records: what a record's image value names, where it is, and whether it is a readable image.

An image value is one of: a path (relative to the data file's folder, or absolute: /data inside the container), a
`data:image/...;base64,` URI, base64 text, raw bytes (a Parquet/Arrow binary column), or the datasets Image feature's
`{"bytes", "path"}`. A URL (http, https, s3, gs, hf, ...) is refused: nothing is downloaded in a run. Each image is
read once, decoded by Pillow to check it (a missing, unreadable or corrupt image is a bad record, named by the
caller with its file and line), measured, and hashed: the hashes key the data and go into provenance.json (a file's
hash through trainer.provenance, which then reads it no second time). Torch-free; Pillow is imported on first use.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import io
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainer.data.chat import BadRecord

URL = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*://")
DATA_URI = re.compile(r"^data:image/[\w.+-]+;base64,", re.IGNORECASE)
MAGIC = (b"\x89PNG", b"\xff\xd8\xff", b"GIF8", b"RIFF", b"BM", b"II*\x00", b"MM\x00*")  # PNG JPEG GIF WEBP BMP TIFF
MAX_IMAGE_PIXELS = 1 << 28  # Pillow's decompression-bomb guard, raised for large scans but kept finite


@dataclass(frozen=True)
class ImageRef:
    """One image of a record: a file (`path`) or embedded bytes (`data`), named for messages by `label`."""

    label: str
    path: Path | None = None
    data: bytes | None = None


@dataclass(frozen=True)
class ImageFacts:
    """What reading an image found: its sha256 (of the file's or the embedded bytes), width and height."""

    sha256: str
    width: int
    height: int
    path: str | None = None  # the file it came from (None: embedded)


def image_ref(value: Any, base: Path, what: str) -> ImageRef:
    """The image `value` names, for a record of a data file in folder `base`; BadRecord says why it names none.
    `what` names the value in messages (e.g. "images[2]")."""
    if isinstance(value, dict):
        return _from_mapping(value, base, what)
    if isinstance(value, (bytes, bytearray, memoryview)):
        return ImageRef(f"{what} (embedded bytes)", data=bytes(value))
    if not isinstance(value, str) or not value.strip():
        raise BadRecord(f"{what} is {type(value).__name__ if value is not None else 'null'}, not an image path, "
                        "base64 text or bytes")  # fmt: skip
    return _from_text(value.strip(), base, what)


def _from_mapping(value: dict[str, Any], base: Path, what: str) -> ImageRef:
    """The datasets Image feature ({bytes, path}: bytes first), an OpenAI image_url part's {url}, or {path}."""
    if value.get("bytes") is not None:
        return image_ref(value["bytes"], base, what)
    for key in ("path", "url", "image", "base64"):
        if isinstance(value.get(key), str) and value[key]:
            return _from_text(value[key], base, what)
    raise BadRecord(f"{what} holds no image ({', '.join(sorted(value)) or 'empty'}); give bytes or a path")


def _from_text(text: str, base: Path, what: str) -> ImageRef:
    if DATA_URI.match(text):
        return ImageRef(f"{what} (data URI)", data=_base64(text.split(",", 1)[1], what))
    if URL.match(text):
        raise BadRecord(f"{what} is a URL ({text[:80]}); nothing is downloaded during a run: fetch the image "
                        "first and give its path (relative to the data file)")  # fmt: skip
    path = Path(text) if Path(text).is_absolute() else base / text
    if len(text) > 256 and not path.suffix:  # no path is this long without a suffix: base64 text
        return ImageRef(f"{what} (base64)", data=_base64(text, what))
    return ImageRef(text, path=path)


def _base64(text: str, what: str) -> bytes:
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise BadRecord(f"{what} is neither a path nor valid base64 ({exc})") from None


def read_image(ref: ImageRef) -> tuple[Any, ImageFacts]:
    """(the decoded RGB image, its facts); BadRecord for a missing, unreadable or corrupt image."""
    data = ref.data
    if data is None:
        assert ref.path is not None
        try:
            data = ref.path.read_bytes()
        except FileNotFoundError:
            raise BadRecord(f"image {ref.label} not found ({ref.path})") from None
        except OSError as exc:
            raise BadRecord(f"image {ref.label} cannot be read ({exc.strerror or exc})") from None
    image = decode(data, ref.label)
    digest = hashlib.sha256(data).hexdigest()
    if ref.path is not None:
        from trainer.provenance import remember_sha256

        remember_sha256(ref.path, digest, len(data))  # provenance.json's entry, without reading it again
    path = str(ref.path) if ref.path is not None else None
    return image, ImageFacts(digest, image.width, image.height, path)


def decode(data: bytes, label: str) -> Any:
    """The bytes as an RGB PIL image, fully decoded (a truncated file fails here, not in the middle of training)."""
    from PIL import Image, UnidentifiedImageError

    Image.MAX_IMAGE_PIXELS = MAX_IMAGE_PIXELS
    if not data:
        raise BadRecord(f"image {label} is empty (0 bytes)")
    try:
        with Image.open(io.BytesIO(data)) as opened:
            opened.load()
            return opened.convert("RGB")
    except UnidentifiedImageError:
        kind = "an image format Pillow does not read" if data.startswith(MAGIC) else "not an image"
        raise BadRecord(f"image {label} is {kind}") from None
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as exc:
        raise BadRecord(f"image {label} is corrupt or truncated ({exc})") from None
