"""A file's bytes in anonymous memory backed by 2 MB pages (Linux's transparent huge pages), so
that the weights a decode step streams cost one TLB entry every 2 MB instead of every 4 KB.

A decode step on a CPU reads every weight once (106 MB for the default model's layers, 134 MB
with its output layer); mapped from the disk cache's file they lie on 4 KB pages of the page
cache, which the kernel cannot back with huge pages. The same bytes read into a private
anonymous mapping advised ``MADV_HUGEPAGE`` before its first touch are backed by 2 MB pages.
Measured on a 2-core AMD EPYC Zen 4 under KVM (``benchmarks/bench_hugepages.py``, a
comparison's rows decoded alternately on both copies in one process, medians of 10-12 rounds):
the default model's int8 weights at 1 / 4 / 8 rows 6.71 / 8.19 / 11.68 -> 5.92 / 7.82 / 11.39
ms a step and, in a slower quarter of an hour, 7.81 / 9.85 / 12.17 -> 7.15 / 8.99 / 11.97; a
1B Llama's int4 weights (``--ckpt ... --quantize int4``) 31.99 -> 29.45 ms at one row.
The price is a read of the file, which the mapping left to the first step's page faults: 800
MB into huge pages took 0.17-0.46 s, and 1.5-2.4 s in a process whose memory the machine had
not touched for a while (most likely the virtual machine's host backing its freed blocks again
as they are touched): longer than a 1B model's whole cached start (0.53 s to load). So a
cached start runs on the file's mapping at once and reads the copy on a thread of its own,
taken in at the first step after (``runner.ResidentWeights``): ``benchmarks/bench_load.py``,
a 1B Q4_K_M's cached int4 start 0.37 s to load (a synchronous read made it 2.60 s), its first
token 0.25 s (0.09: the read shares the cores). Where the platform has no ``MADV_HUGEPAGE`` or
the kernel's ``transparent_hugepage`` setting is ``never``, ``huge_pages_available`` says so
and callers keep the file mapping (the same bytes, on small pages).
"""

from __future__ import annotations

import ctypes
import mmap
import os
from pathlib import Path
from typing import Callable

HUGE_PAGE = 2 << 20
_SETTING = Path("/sys/kernel/mm/transparent_hugepage/enabled")
_CHUNK = 64 << 20  # one read() call's bytes (Linux reads at most ~2 GB a call)


class ReadStopped(Exception):
    """``read_file`` was asked to stop before the end of the file."""


def huge_pages_available() -> bool:
    """Whether an ``MADV_HUGEPAGE`` mapping can get huge pages here: Linux, with the kernel's
    ``transparent_hugepage`` setting ``always`` or ``madvise``."""
    if not hasattr(mmap, "MADV_HUGEPAGE") or not hasattr(mmap, "MAP_PRIVATE"):
        return False
    try:
        setting = _SETTING.read_text()
    except OSError:
        return False
    return "[never]" not in setting


def anonymous(nbytes: int) -> mmap.mmap:
    """A private anonymous mapping of ``nbytes`` (zeros) advised ``MADV_HUGEPAGE`` before any
    page of it is touched (a page touched before the advice stays 4 KB).

    Raises:
        OSError: the mapping could not be made.
    """
    buf = mmap.mmap(-1, max(1, nbytes), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    try:
        buf.madvise(mmap.MADV_HUGEPAGE)
    except OSError:  # an old kernel without the advice: small pages, the same bytes
        pass
    return buf


def address(buf: mmap.mmap) -> int:
    """The address of a mapping's first byte."""
    return ctypes.addressof(ctypes.c_char.from_buffer(buf))


def read_file(path: Path, stop: Callable[[], bool] | None = None) -> tuple[mmap.mmap, int]:
    """The whole file ``path`` read into ``anonymous`` memory: (the mapping, the offset of the
    file's first byte in it), the offset putting that byte on a 2 MB boundary (the kernel gives
    a huge page only to a whole aligned 2 MB of a mapping). ``stop`` is asked before each
    ``_CHUNK`` read.

    Raises:
        OSError: the file could not be read, or it ended before its size.
        ReadStopped: ``stop()`` said so before the end.
    """
    with open(path, "rb", buffering=0) as f:
        size = os.fstat(f.fileno()).st_size
        buf = anonymous(size + HUGE_PAGE)
        start = -address(buf) % HUGE_PAGE
        view = memoryview(buf)
        try:
            done = 0
            while done < size:
                if stop is not None and stop():
                    raise ReadStopped(f"reading {path} was stopped")
                got = f.readinto(view[start + done:start + min(size, done + _CHUNK)])
                if not got:
                    raise OSError(f"{path} ended after {done} of its {size} bytes")
                done += got
        finally:
            view.release()
    return buf, start


def _smaps() -> list[tuple[int, int, dict[str, str]]]:
    """(start, end, fields) of each mapping of this process in ``/proc/self/smaps`` (empty
    where it cannot be read)."""
    try:
        text = Path("/proc/self/smaps").read_text()
    except OSError:
        return []
    out: list[tuple[int, int, dict[str, str]]] = []
    for line in text.splitlines():
        head, _, rest = line.partition(" ")
        if head.endswith(":"):
            if out:
                out[-1][2][head[:-1]] = rest.strip()
        elif "-" in head:
            lo, hi = (int(x, 16) for x in head.split("-"))
            out.append((lo, hi, {}))
    return out


def advised(address: int) -> bool:
    """Whether the mapping holding ``address`` is advised ``MADV_HUGEPAGE`` (its ``VmFlags``
    in ``/proc/self/smaps`` hold ``hg``)."""
    return any(lo <= address < hi and "hg" in fields.get("VmFlags", "").split()
               for lo, hi, fields in _smaps())


def huge_bytes(address: int, nbytes: int) -> int | None:
    """How many of the bytes [address, address + nbytes) lie in huge pages, from
    ``/proc/self/smaps`` (None where it cannot be read): each mapping's ``AnonHugePages``,
    at most its overlap with the range. What a benchmark reports; the kernel may split a huge
    page (reclaiming memory) or give small pages where it has no free 2 MB."""
    maps = _smaps()
    if not maps:
        return None
    total = 0
    for lo, hi, fields in maps:
        if lo < address + nbytes and address < hi:
            mapped = int(fields.get("AnonHugePages", "0 kB").split()[0]) * 1024
            total += min(mapped, min(hi, address + nbytes) - max(lo, address))
    return total


def return_freed_memory() -> None:
    """Hand the C heap's freed memory back to the kernel (glibc's ``malloc_trim``; nothing
    elsewhere): weights just let go would otherwise stay in the process's resident memory
    beside the huge pages that replace them."""
    try:
        libc = ctypes.CDLL(None)
        trim = libc.malloc_trim
    except (OSError, AttributeError):
        return
    trim(ctypes.c_size_t(0))

