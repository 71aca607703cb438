"""The content digest of a weight file, computed once per version of the file.

Caches derived from weights (int8/int4 weights, a GGUF's converted metadata) were keyed by file
names and sizes, so a base model and its fine-tune (same names, same shapes, same sizes) shared
one cache entry and silently loaded each other's weights. The key is now the sha256 of every
byte. Hashing is about 1.5 GB/s on one core here (SHA-NI), so it is done once: the digest is
remembered under ``<cache>/digests`` with the file's device, inode, size and mtime, and reused
while all four are unchanged, as git trusts its index. A file modified within ``RACY_S`` of
being hashed is not remembered (its mtime may not move on a rewrite that fast: git's "racily
clean" problem), so it is hashed again next time.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path

from ..paths import cache_root

RACY_S = 2.0
"""A file whose mtime is this close to the moment it was hashed is hashed again next time."""
_CHUNK = 8 << 20


def _record_path(path: Path) -> Path:
    key = hashlib.sha256(str(path).encode()).hexdigest()[:24]
    return cache_root() / "digests" / f"{key}.json"


def _identity(st: os.stat_result) -> dict[str, int]:
    return {"dev": st.st_dev, "ino": st.st_ino, "size": st.st_size, "mtime_ns": st.st_mtime_ns}


def hash_file(path: Path) -> str:
    """sha256 of the file's bytes (hex), read 8 MiB at a time into one buffer (the page cache
    holds the file, not this process)."""
    h = hashlib.sha256()
    buf = bytearray(_CHUNK)
    view = memoryview(buf)
    with path.open("rb", buffering=0) as f:
        while n := f.readinto(buf):
            h.update(view[:n])
    return h.hexdigest()


def file_digest(path: Path) -> str:
    """The sha256 of ``path``'s contents, from the remembered record while the file's identity
    (device, inode, size, mtime) is unchanged, else hashed now (and remembered)."""
    path = Path(path).resolve()
    st = path.stat()
    ident = _identity(st)
    record = _record_path(path)
    try:
        saved = json.loads(record.read_text())
        if saved.get("identity") == ident and isinstance(saved.get("sha256"), str):
            return saved["sha256"]
    except (OSError, ValueError):
        pass
    started = time.time()
    digest = hash_file(path)
    if started - st.st_mtime_ns / 1e9 > RACY_S and _identity(path.stat()) == ident:
        try:
            record.parent.mkdir(parents=True, exist_ok=True)
            tmp = record.with_suffix(f".tmp{os.getpid()}")
            tmp.write_text(json.dumps({"path": str(path), "identity": ident, "sha256": digest}))
            os.replace(tmp, record)
        except OSError:  # a read-only cache costs a hash per start, nothing else
            pass
    return digest
