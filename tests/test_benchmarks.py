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


def test_kernels_ab_driver_calls_attention_as_the_abi_declares_it(tmp_path, kernel):
    """``benchmarks/bench_kernels_ab.py`` times ``attn_decode`` of two builds from a C driver
    of its own: the driver passes the arguments ``kernel_abi`` declares (17), and run on this
    machine's build twice it reports two times and the rounds it took."""
    import re
    import subprocess

    from benchmarks.bench_kernels_ab import DRIVER
    from inference import kernel_abi, q8kernel

    declared = re.search(r"typedef void \(\*attn_t\)\(([^;]*)\);", DRIVER)
    assert declared is not None
    assert len(declared.group(1).split(",")) == len(kernel_abi.SIGNATURES["attn_decode"][1])
    plan = q8kernel.plan_build()
    (tmp_path / "d.c").write_text(DRIVER)
    subprocess.run([plan.cc, "-O2", str(tmp_path / "d.c"), "-o", str(tmp_path / "d"), "-ldl",
                    "-lm"], check=True)
    lib = str(plan.path)
    out = subprocess.run([str(tmp_path / "d"), "2", "0.05", "2", lib, lib], check=True,
                         capture_output=True, text=True, timeout=60).stdout.split()
    a, b, rounds = float(out[0]), float(out[1]), int(out[2])
    assert a > 0 and b > 0 and rounds >= 1
