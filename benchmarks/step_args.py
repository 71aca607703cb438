"""What the step benchmarks (``bench_step_split.py``, ``bench_layer_phases.py``) share: their
common flags and the engine they time (the default model, int8, as ``chatui`` runs it)."""

from __future__ import annotations

import argparse

import torch

from inference.checkpoint import load_checkpoint
from inference.engine import LocalBackend


def step_parser(description: str) -> argparse.ArgumentParser:
    """``--rounds``, ``--rows`` (comma-separated row counts) and ``--threads``."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--rows", default="1,4,8")
    parser.add_argument("--threads", type=int, default=2)
    return parser


def default_engine(threads: int) -> LocalBackend:
    """The default model with int8 weights on ``threads`` threads."""
    torch.set_num_threads(threads)
    return LocalBackend.from_checkpoint(load_checkpoint(None, lazy=True), quantize="int8",
                                        precision="auto")
