"""The fast runner's KV cache: every layer's keys and values in preallocated tensors.

It has the cache operations the engine uses on a transformers ``DynamicCache`` (crop,
batch_repeat_interleave, batch_select_indices, deepcopy, get_seq_length), so the engine treats
both runners' caches alike. Its own module so the model (``fast_llama``) and the compiled step
(``decode_graph``) both use it without importing each other.
"""

from __future__ import annotations

from typing import Callable

import torch

CACHE_BLOCK = 256
"""KV cache capacity grows in multiples of this many positions."""


class StaticKVCache:
    """Keys and values of every layer in preallocated tensors, one [B, KV, C, D] per layer.

    ``length`` positions are valid; the capacity C grows in blocks (a copy) only when a
    prompt outgrows it, so decoding writes in place. Layers are separate tensors (not views of
    one) so a compiled step can update each in place as its own input. Every tensor is made in
    inference mode, wherever the cache is made or copied from: the compiled step guards on a
    tensor's dispatch keys, and a cache made outside it (the engine's) then grown inside it
    (the step's) recompiled the step (4-6 s on an H100, 25 s on a CPU) inside a reply.
    """

    @torch.inference_mode()
    def __init__(self, n_layers: int, n_kv: int, head_dim: int, *, dtype: torch.dtype,
                 device: torch.device, batch: int = 1, capacity: int = CACHE_BLOCK) -> None:
        shape = (batch, n_kv, capacity, head_dim)
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(n_layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(n_layers)]
        self.length = 0
        self.shared = 0
        """Positions 0..shared-1 hold the same keys and values in every row (a prefill
        repeated by ``batch_repeat_interleave``): chatui's C attention reads them from row 0
        only, so B rows of a compare or a fan-out read the prompt's cache once, not B times."""

    @property
    def capacity(self) -> int:
        return self.k[0].shape[2]

    @property
    def batch(self) -> int:
        return self.k[0].shape[0]

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.length

    def reserve(self, needed: int, batch: int) -> None:
        """Make room for ``needed`` positions of ``batch`` rows (an empty cache takes any batch
        size; a filled one keeps its valid positions)."""
        if batch != self.batch:
            if self.length:
                raise ValueError(f"cache holds {self.batch} rows, got {batch}")
            self._replace(lambda t: t.new_zeros((batch, *t.shape[1:])))
        if needed <= self.capacity:
            return
        cap = max(needed, 2 * self.capacity)
        cap = -(-cap // CACHE_BLOCK) * CACHE_BLOCK
        self._replace(lambda t: self._moved(t, self.batch, cap, None))

    @torch.inference_mode()
    def _replace(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> None:
        self.k = [fn(t) for t in self.k]
        self.v = [fn(t) for t in self.v]

    def _moved(self, t: torch.Tensor, batch: int, cap: int,
               fill: Callable[[torch.Tensor], torch.Tensor] | None) -> torch.Tensor:
        _, kv, _, d = t.shape
        new = torch.zeros((batch, kv, cap, d), dtype=t.dtype, device=t.device)
        used = t[:, :, : self.length]
        new[:, :, : self.length] = fill(used) if fill else used
        return new

    def crop(self, max_length: int) -> None:
        """transformers' semantics: negative = drop that many positions, else keep that many."""
        if max_length < 0:
            max_length = self.length + max_length
        self.length = max(0, min(self.length, max_length))
        self.shared = min(self.shared, self.length)

    def batch_repeat_interleave(self, n: int) -> None:
        """Each row becomes n consecutive rows (one prefill shared by n replies)."""
        rep = lambda t: t.repeat_interleave(n, dim=0)  # noqa: E731
        rows, cap = self.batch * n, self.capacity
        if self.batch == 1:
            self.shared = self.length
        self._replace(lambda t: self._moved(t, rows, cap, rep))

    @torch.inference_mode()
    def repeated(self, n: int, room: int = 0, pool: StaticKVCache | None = None
                 ) -> StaticKVCache:
        """A new cache whose rows are each of this one's n times (``copy.deepcopy`` then
        ``batch_repeat_interleave(n)``, this cache untouched), with capacity for ``room``
        positions. A comparison or a fan-out knows how long its rows may grow: one allocation
        of that size replaces a copy of the conversation's cache, its repeat, and the copies
        that grow the capacity while decoding. At 8 rows of the default model (138-token
        prompt, 128 new tokens) those were 75-120 ms of a 1.3 s request, most of it zeroing
        and faulting in fresh memory twice (the repeat's and the growth's).

        ``pool`` (``memory()`` of an earlier repeat whose decoding is over) lends its tensors
        when they have at least the rows and capacity, and this cache's layers, heads, dtype
        and device: a fresh allocation's pages are faulted in as the rows decode, about 1 us
        a page (8 rows of the default model with room for 512 positions: 22,000 faults, 25-30
        ms of a 1 s comparison). Positions past ``length`` then keep what the pool held: every
        reader writes a position before it reads it (the compiled step's attention, which
        covers the whole capacity, masks them)."""
        new = object.__new__(StaticKVCache)
        new.length = self.length
        new.shared = self.length if self.batch == 1 else self.shared
        cap = max(self.capacity, -(-max(room, self.length) // CACHE_BLOCK) * CACHE_BLOCK)
        rows = self.batch * n
        lent: list[torch.Tensor | None] = [None] * (2 * len(self.k))
        if (pool is not None and pool.k and len(pool.k) == len(self.k)
                and pool.batch >= rows and pool.capacity >= cap
                and pool.k[0].shape[1::2] == self.k[0].shape[1::2]
                and pool.k[0].dtype == self.k[0].dtype
                and pool.k[0].device == self.k[0].device):
            cap = pool.capacity
            lent = [t[:rows] for t in (*pool.k, *pool.v)]  # (the first rows: contiguous)

        def rep(t: torch.Tensor, out: torch.Tensor | None) -> torch.Tensor:
            _, kv, _, d = t.shape
            if out is None:
                out = torch.zeros((rows, kv, cap, d), dtype=t.dtype, device=t.device)
            # each source row copied into its n rows in one broadcast copy (no repeated
            # intermediate)
            out.view(self.batch, n, kv, cap, d)[:, :, :, : self.length] = (
                t[:, None, :, : self.length])
            return out

        made = [rep(t, out) for t, out in zip((*self.k, *self.v), lent)]
        new.k, new.v = made[: len(self.k)], made[len(self.k):]
        return new

    @classmethod
    @torch.inference_mode()
    def stacked(cls, rows: list[StaticKVCache], end: int) -> StaticKVCache:
        """One cache of the one-row caches ``rows``, each row's positions moved to end at
        ``end`` (left padding before them, zeros): the prompts of ``chatui batch`` prefilled
        one by one, as ``chatui generate`` prefills a prompt, then decoded together."""
        first = rows[0]
        cap = -(-max(end, 1) // CACHE_BLOCK) * CACHE_BLOCK

        def stack(layer: list[torch.Tensor]) -> torch.Tensor:
            _, kv, _, d = layer[0].shape
            out = torch.zeros((len(rows), kv, cap, d), dtype=layer[0].dtype,
                              device=layer[0].device)
            for b, (row, t) in enumerate(zip(rows, layer)):
                out[b, :, end - row.length: end] = t[0, :, : row.length]
            return out

        new = object.__new__(cls)
        new.k = [stack([r.k[i] for r in rows]) for i in range(len(first.k))]
        new.v = [stack([r.v[i] for r in rows]) for i in range(len(first.v))]
        new.length, new.shared = end, 0
        return new

    def memory(self) -> StaticKVCache:
        """An empty cache over this one's tensors, for ``repeated``'s ``pool``: what it
        holds is the memory, not the positions (nothing may decode in it while this cache
        or another over the same tensors does)."""
        pool = object.__new__(StaticKVCache)
        pool.k, pool.v = list(self.k), list(self.v)
        pool.length = pool.shared = 0
        return pool

    def holds_memory_of(self, pool: StaticKVCache | None) -> bool:
        """Whether this cache's tensors are ``pool``'s (lent by ``repeated``)."""
        return bool(pool is not None and pool.k and self.k
                    and self.k[0].data_ptr() == pool.k[0].data_ptr())

    def batch_select_indices(self, idx: torch.Tensor) -> None:
        """Keep only the rows in idx (finished rows leave the batch)."""
        sel = lambda t: t.index_select(0, idx.to(t.device))  # noqa: E731
        cap = self.capacity
        self._replace(lambda t: self._moved(t, len(idx), cap, sel))

    @torch.inference_mode()
    def __deepcopy__(self, memo: dict) -> StaticKVCache:
        new = object.__new__(StaticKVCache)
        new.k = [t.clone() for t in self.k]
        new.v = [t.clone() for t in self.v]
        new.length = self.length
        new.shared = self.shared
        return new

    @property
    def nbytes(self) -> int:
        return 2 * sum(t.numel() * t.element_size() for t in self.k)
