"""The benchmarks that patch the engine's sources keep finding what they patch."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_layer_phases_finds_each_line_it_clocks_in_decode_c():
    """``benchmarks/bench_layer_phases.py`` builds decode.c with clocks before the lines it
    names; each must be there exactly once (else the benchmark stops with a message)."""
    from benchmarks.bench_layer_phases import TIMERS

    source = (REPO / "inference" / "kernels" / "decode.c").read_text()
    for line, _ in TIMERS:
        assert source.count(line) == 1, line
