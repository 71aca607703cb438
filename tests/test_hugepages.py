"""The disk cache's weights read into huge pages (``inference/hugepages.py``, ``st_io``)."""

from __future__ import annotations

import mmap
from pathlib import Path

import pytest
import torch

from inference import hugepages, st_io

from conftest import skip_unless_ci


def _file(tmp_path: Path) -> tuple[Path, dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    tensors = {"a": torch.randint(-127, 128, (3 << 20,), dtype=torch.int8, generator=g),
               "b": torch.randn(1000, 7, generator=g).half(), "c": torch.zeros(0, 4),
               "d": torch.arange(5, dtype=torch.int64)}
    path = tmp_path / "w.safetensors"
    st_io.save(tensors, path, metadata={"format": "test"})
    return path, tensors


def test_a_resident_load_is_the_file_in_one_aligned_buffer(tmp_path: Path) -> None:
    """Every tensor equals what was saved, all are views of one copy of the file's bytes advised
    MADV_HUGEPAGE, and the file's first byte lies on a 2 MB boundary (only whole aligned 2 MB
    get huge pages)."""
    if not hugepages.huge_pages_available():
        skip_unless_ci("this kernel gives no transparent huge pages")
    path, tensors = _file(tmp_path)
    buf, start = hugepages.read_file(path)
    assert (hugepages.address(buf) + start) % hugepages.HUGE_PAGE == 0
    assert buf[start:start + path.stat().st_size] == path.read_bytes()
    loaded = st_io.load_resident(path)
    assert set(loaded) == set(tensors)
    for name, t in tensors.items():
        assert loaded[name].dtype == t.dtype and torch.equal(loaded[name], t)
    assert hugepages.advised(loaded["a"].data_ptr())
    # An unadvised mapping of our own, not the saved tensor: that one lies wherever the C heap
    # put it, and once (CI, deep into the suite) the heap's mapping itself read ``hg``.
    plain = mmap.mmap(-1, 4 << 20, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    plain[:] = b"\1" * len(plain)
    assert not hugepages.advised(hugepages.address(plain))


def test_huge_bytes_counts_a_touched_huge_page() -> None:
    """``huge_bytes`` (what the benchmark reports) sees the huge pages of an advised mapping
    once touched (unless the kernel says it fell back to small pages, short of free 2 MB)."""
    if not hugepages.huge_pages_available():
        skip_unless_ci("this kernel gives no transparent huge pages")
    fell_back = _fallbacks()
    buf = hugepages.anonymous(8 << 20)
    start = hugepages.address(buf)
    buf[:] = b"\1" * len(buf)
    assert hugepages.advised(start)
    huge = hugepages.huge_bytes(start, len(buf))
    assert huge is not None and huge <= len(buf)
    assert huge % hugepages.HUGE_PAGE == 0
    # small pages only where the kernel counted a fault it could not give a 2 MB page
    assert huge or _fallbacks() > fell_back


def _fallbacks() -> int:
    """The kernel's count of huge page faults that fell back to small pages."""
    for line in Path("/proc/vmstat").read_text().splitlines():
        if line.startswith("thp_fault_fallback "):
            return int(line.split()[1])
    return 0


def test_without_huge_pages_the_file_is_mapped(tmp_path: Path, monkeypatch) -> None:
    """A kernel set to ``never`` (or a platform without the advice) keeps the file mapping."""
    setting = tmp_path / "enabled"
    setting.write_text("always madvise [never]\n")
    monkeypatch.setattr(hugepages, "_SETTING", setting)
    assert not hugepages.huge_pages_available()
    path, tensors = _file(tmp_path)
    read = []
    monkeypatch.setattr(hugepages, "read_file", lambda p: read.append(p))
    loaded = st_io.load_resident(path)
    assert not read and torch.equal(loaded["b"], tensors["b"])
    setting.write_text("always [madvise] never\n")
    assert hugepages.huge_pages_available() == hasattr(__import__("mmap"), "MADV_HUGEPAGE")


def test_a_truncated_file_is_refused(tmp_path: Path) -> None:
    """A cache file cut short raises (the caller rebuilds the cache) rather than giving
    tensors that read past its end."""
    path, _ = _file(tmp_path)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 100])
    with pytest.raises(ValueError, match="past the end"):
        st_io.load_resident(path)
    with pytest.raises(ValueError, match="past the end"):
        st_io.load_mapped(path)


def test_a_read_asked_to_stop_ends_without_a_warning(tmp_path: Path, caplog) -> None:
    """``stop`` ends the read before its next chunk: ``read_file`` raises ``ReadStopped`` and
    the int8 cache's loader gives nothing, without calling the file unreadable (it is fine)."""
    from inference.quant import load_int8

    if not hugepages.huge_pages_available():
        skip_unless_ci("this kernel gives no transparent huge pages")
    path, _ = _file(tmp_path)
    with pytest.raises(hugepages.ReadStopped):
        hugepages.read_file(path, stop=lambda: True)
    with caplog.at_level("WARNING"):
        assert load_int8(path, torch.device("cpu"), resident=True, stop=lambda: True) is None
    assert not caplog.records
    assert load_int8(path, torch.device("cpu"), resident=True, stop=lambda: False) is not None

