"""What the engine's process does with its heap once the model is loaded."""

from __future__ import annotations

import gc


def settle_heap() -> None:
    """Once the model is loaded: a full collection, then everything alive (the model's modules
    and tensors' Python objects, the tokenizer, the libraries) frozen out of the collector's
    view, as the process keeps it to the end. Without it, the objects a reply's events leave
    alive (tokens, alternatives) made the collector's oldest generation due every few hundred
    tokens, and each such collection walked every object of the process: 170 ms, in the middle
    of an 8-column comparison of the default model (a 1.1 s request), a stall in the stream and
    15% of what ``chatui bench --compare`` measured when it fell in a batched run. Frozen, the
    collections of that request took 3 ms in all. Objects frozen are still freed when their
    last reference goes (only reference cycles among them wait for the process to end).

    Called where the engine owns its process: the isolated worker's child after its load, and
    a headless command's (``InferenceWorker(settle_heap=True)``: its in-process engine had
    the collector walk everything a compiled model on a GPU left alive, a batched run of
    ``chatui bench --compare`` there taking 0.4-1.7 s where the others took 0.25). Never the
    chat UI's process, whose policy is ``chatui/gcpolicy.py``'s."""
    gc.collect()
    gc.freeze()
