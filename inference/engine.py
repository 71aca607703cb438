"""The local engine: an own decode loop over a transformers causal LM.

``LocalBackend.generate`` encodes the conversation, reuses the longest cached prefix,
prefills the rest in chunks, then decodes all rows of the request together, each with its own
sampling settings, yielding token events with raw logprobs, top-k alternatives and entropy.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Generator, Iterator, Sequence

import torch

from .chat import PromptTooLongError, TemplateOptions, encode_messages, encode_request
from .detok import IncrementalDetokenizer, StopStringFilter, ids_decoder
from .fast_llama import Interrupted
from .kv_cache import StaticKVCache
from .reasoning import ChannelSplitter, detect_format
from .runner import HFRunner
from .sampling import CUT_NAMES, RowSampling, decode_step_outputs, score_stats, token_stats
from .settings import SamplingParams
from .threads import ThreadTuner, fixed_threads
from .types import (
    Alternative,
    AssistantPrefix,
    Event,
    Failed,
    GenerationRequest,
    Message,
    ModelInfo,
    PromptProgress,
    RowDone,
    SamplerCut,
    Scored,
    ScoreRequest,
    Started,
    Token,
    TokenBatch,
    Usage,
)

log = logging.getLogger(__name__)


POOL_BYTES = 512 << 20
"""The largest batched cache whose memory is kept for later comparisons (8 rows of the
default model with room for 512 positions: 94 MB)."""


def _repeated(cache: Any, n: int, room: int, pool: Any) -> Any:
    """A copy of ``cache`` with each row n times, for rows that may grow to ``room``
    positions: the fast runner's cache makes it in one allocation of that size, or in the
    memory of ``pool`` (``StaticKVCache.repeated``), transformers' by a deep copy and its
    repeat."""
    repeated = getattr(cache, "repeated", None)
    if repeated is not None:
        return repeated(n, room, pool)
    out = copy.deepcopy(cache)
    out.batch_repeat_interleave(n)
    return out


def _with_text(tok: Token, text: str) -> Token:
    return dataclasses.replace(tok, text=text)


def _placed(tok: Token, text: str, glyph_start: int | None) -> Token:
    """``dataclasses.replace(tok, text=text, glyph_start=glyph_start)`` for every token of
    every row and step, without replace's walk over the fields (2 us against 0.9 a token;
    tests/test_engine.py holds it to replace's result for a token with every field set)."""
    return Token(tok.index, tok.id, text, tok.logprob, tok.entropy, tok.top, tok.special,
                 glyph_start, tok.raw, tok.channel, tok.sampler)


def _sampler_cut(stats: list[float], k: int) -> SamplerCut | None:
    """``sampler_stats``' columns of one row (after ``token_stats``' 3 + 2k), if present."""
    base = 3 + 2 * k
    if len(stats) < base + 2 + 2 * k:
        return None  # a forced token: not sampled
    return SamplerCut(float(stats[base]), int(stats[base + 1]),
                      tuple(map(float, stats[base + 2: base + 2 + k])),
                      tuple(CUT_NAMES[int(c)] for c in stats[base + 2 + k: base + 2 + 2 * k]))


class _TokenView:
    """Adapter giving Token the ``with_text`` the stop filter needs."""

    __slots__ = ("token",)

    def __init__(self, token: Token) -> None:
        self.token = token

    @property
    def text(self) -> str:
        return self.token.text

    def with_text(self, text: str) -> _TokenView:
        return _TokenView(_with_text(self.token, text))


@dataclass
class _Row:
    """Host-side state of one row while it decodes."""

    settings: SamplingParams
    detok: IncrementalDetokenizer
    stops: StopStringFilter
    prompt_len: int
    glyph: list[Token] = field(default_factory=list)
    generated: int = 0
    first_at: float | None = None
    last_at: float | None = None
    done: bool = False
    split: ChannelSplitter | None = None
    """Reasoning and answer (None: the model marks no reasoning, or a raw request)."""
    held: list[Token] = field(default_factory=list)
    """Tokens the splitter holds back (a harmony header), in order."""
    force: list[int] = field(default_factory=list)
    """Ids to feed instead of sampled ones (the reasoning budget's closing marker)."""
    budget_spent: bool = False
    fed: list[int] = field(default_factory=list)
    """The reply position of each token the detokenizer has seen (it starts afresh at a
    reasoning marker, so its own positions are not the reply's)."""


class LocalBackend:
    """Runs a transformers model in-process. See the module docstring.

    Args:
        model: a causal LM in eval mode on its device.
        tokenizer: its tokenizer (with a chat template).
        eos_token_ids: every id that ends a reply.
        info: what the app shows about the model.
        prefill_chunk: longest slice of the prompt fed in one forward.
    """

    def __init__(self, model: Any, tokenizer: Any, *, eos_token_ids: Sequence[int],
                 info: ModelInfo, prefill_chunk: int = 512, runner: Any = None) -> None:
        self.tokenizer = tokenizer
        self.info = info
        self.eos_ids = frozenset(int(i) for i in eos_token_ids)
        self.runner = runner if runner is not None else HFRunner(model)
        self.device = self.runner.device
        self.prefill_chunk = prefill_chunk
        self.special_ids = frozenset(getattr(tokenizer, "all_special_ids", []) or [])
        self.reasoning = detect_format(tokenizer)
        """The model's reasoning markers (None: it has none)."""
        if self.reasoning is not None and self.reasoning.kind == "harmony":
            # harmony's <|end|> ends the analysis message, not the reply (which ends with
            # <|return|>): counted as an end of turn, the reply stopped after its reasoning
            self.eos_ids = self.eos_ids - {self.reasoning.end_id}
        if self.reasoning is not None:
            self.info = dataclasses.replace(info, reasoning=self.reasoning.kind,
                                            thinking_switch=self.reasoning.switch)
        self.vocab_size = _vocab_size(self.runner, model, tokenizer)
        """Ids below this are tokens of the model (its embedding table's rows)."""
        self._piece_cache: dict[int, str] = {}
        self._piece_decode = ids_decoder(tokenizer, skip_special_tokens=False)
        self._singles: dict[int, str] = {}  # the detokenizers' one-token decodes
        self._cache: Any = None
        self._cache_ids: list[int] = []
        self._pool: Any = None
        """The memory of an earlier comparison's or fan-out's cache, which later ones of as
        many rows or fewer decode in (``StaticKVCache.repeated``; a CPU's pages are faulted
        in once, a GPU's allocator keeps its own); up to POOL_BYTES, kept across ``reset``
        (it holds no conversation)."""
        self.threads: ThreadTuner | None = None
        """Chooses each CPU decode step's thread count from the steps' times (None: fixed by
        ``CHATUI_THREADS``/``OMP_NUM_THREADS``, or not a CPU); see :mod:`inference.threads`."""
        fixed = fixed_threads()
        if fixed is not None and fixed != torch.get_num_threads():
            torch.set_num_threads(fixed)  # CHATUI_THREADS (torch reads OMP_NUM_THREADS itself)
        # a compiled step (--compile on) is guarded on the thread count: each count the tuner
        # tried would compile it again (25 s a time for the default model)
        compiled = getattr(getattr(self.runner, "decode", None), "compiled", False)
        if self.device.type == "cpu" and fixed is None and not compiled:
            self.threads = ThreadTuner(torch.get_num_threads(), torch.set_num_threads)
        self.pipeline: bool | None = None
        """Queue each decode step before the host handles the previous token: None = on CUDA
        only (where the device then works while the host does; on a CPU it would only delay
        each token by a step)."""

    # ---- small helpers ----

    @classmethod
    def from_checkpoint(cls, ckpt: Any, *, quantize: str = "none", progress: Any = None,
                        precision: str = "model", runner: str = "auto",
                        compile: str = "auto") -> LocalBackend:
        """Build from an ``inference.checkpoint.LoadedCheckpoint``.

        ``quantize`` (auto / none / int8 / int4), ``precision`` (model / auto / a dtype) and ``runner``
        (auto / fast / hf) and ``compile`` (auto / on / off) pick the model runner: see
        ``inference.runner.build_runner``.
        """
        from .runner import build_runner
        from .settings import defaults_from_generation_config

        model_runner = build_runner(ckpt, quantize=quantize or "none", precision=precision,
                                    runner=runner, compile=compile, progress=progress)
        fast = getattr(model_runner, "fast", None)
        quantization = fast.quantize if fast is not None else getattr(model_runner, "quantize",
                                                                        "none")
        dtype = fast.dtype if fast is not None else ckpt.dtype

        info = ModelInfo(
            name=ckpt.name, backend="local", device=str(ckpt.device),
            dtype=str(dtype).replace("torch.", ""), context_limit=ckpt.context_limit,
            checkpoint=ckpt.path, weights_hash=ckpt.weights_hash, quantization=quantization,
            default_settings=defaults_from_generation_config(ckpt.generation_config),
            chat_template_warning=ckpt.chat_template_warning)
        return cls(ckpt.model, ckpt.tokenizer, eos_token_ids=ckpt.eos_token_ids, info=info,
                   runner=model_runner)

    def _detokenizer(self) -> IncrementalDetokenizer:
        """A reply's (or a channel's) detokenizer; all of them share their one-token decodes."""
        return IncrementalDetokenizer(self.tokenizer, singles=self._singles)

    def piece_text(self, token_id: int) -> str:
        """A token's own text for display (alternatives): byte escapes for partial UTF-8."""
        text = self._piece_cache.get(token_id)
        if text is None:  # (the tokenizers library's decode where it is transformers': detok.py)
            text = self._piece_decode([token_id])
            if "\ufffd" in text:
                text = _byte_spelling(self.tokenizer, token_id) or text
            self._piece_cache[token_id] = text
        return text

    def own_prefix(self, prefix: AssistantPrefix | None) -> AssistantPrefix | None:
        """``prefix`` as this model takes it: with its token ids where they are this model's
        (every id in its vocabulary, the spellings given with them this tokenizer's), else
        its text alone, encoded here (a reply made by another model; see
        :attr:`AssistantPrefix.spellings`)."""
        if prefix is None or prefix.token_ids is None or self._own_ids(
                prefix.token_ids, prefix.spellings):
            return prefix
        log.info("a prefix's token ids are another tokenizer's: continuing from its text")
        return AssistantPrefix(prefix.text)

    def _own_ids(self, ids: Sequence[int], spellings: Sequence[tuple[int, str]] = ()) -> bool:
        n = self.vocab_size
        return (all(0 <= i < n for i in ids)
                and all(0 <= i < n and self.piece_text(i) == s for i, s in spellings))

    def _checked(self, request: GenerationRequest) -> GenerationRequest | str:
        """``request`` with its prefix as this model takes it (:meth:`own_prefix`); or why it
        cannot run: forced first tokens (a fan-out's alternatives) that are not this model's
        own."""
        prefix = self.own_prefix(request.prefix)
        if request.first_tokens is not None and (
                prefix is not request.prefix or not self._own_ids(request.first_tokens)):
            return ("That reply was made by a model with another vocabulary: its alternatives "
                    "are not this model's tokens (/retry makes a reply of its own).")
        return request if prefix is request.prefix else dataclasses.replace(request,
                                                                            prefix=prefix)

    def count_tokens(self, messages: tuple[Message, ...]) -> int:
        if not messages:
            return 0
        key = self.reasoning.history_key if self.reasoning is not None else ""
        return len(encode_messages(self.tokenizer, messages,
                                   options=TemplateOptions(reasoning_key=key)))

    def reset(self) -> None:
        self._cache = None
        self._cache_ids = []

    def close(self) -> None:
        self.reset()
        self.runner.close()  # (the fast runner's copy of its weights still being read)

    @property
    def cached_ids(self) -> list[int]:
        """Token ids whose keys and values the cache holds (row 0)."""
        return list(self._cache_ids)

    # ---- prefill ----

    def _reuse_prefix(self, ids: list[int]) -> int:
        """Crop the cache to the longest common prefix with ``ids`` (leaving at least one token
        to feed); returns how many tokens are reused."""
        if self._cache is None:
            return 0
        common = 0
        for a, b in zip(self._cache_ids, ids):
            if a != b:
                break
            common += 1
        common = min(common, len(ids) - 1)
        drop = len(self._cache_ids) - common
        if drop and not self.runner.can_crop(self._cache):
            self.reset()
            return 0
        if common == 0:
            self.reset()
            return 0
        if drop:
            self._cache.crop(-drop)
            self._cache_ids = self._cache_ids[:common]
        return common

    def _prefill(self, ids: list[int], start: int, cancel: threading.Event) -> torch.Tensor | None:
        """Feed ids[start:] into the cache; returns last logits [1, V] (None if cancelled)."""
        steps = self._prefill_steps(ids, start, cancel)
        while True:
            try:
                next(steps)
            except StopIteration as done:
                return done.value

    def _prefill_steps(self, ids: list[int], start: int, cancel: threading.Event
                       ) -> Generator[PromptProgress, None, torch.Tensor | None]:
        """``_prefill`` in chunks of ``prefill_chunk``, yielding a ``PromptProgress`` after
        each chunk when there is more than one (so the app can show how far it has read and
        at what rate); returns the last logits [1, V] (None if cancelled).

        The prompt's last token is fed alone, as a decode step feeds a token, whatever was
        cached: a reply's first logits then do not depend on how much of the prompt a cache
        held. Fed with the rest, a prefill's rows take another path (int8: the prompt's
        rows through torch's attention, a step's through chatui's C step) whose rounding an
        8-bit activation can turn into a different level; measured on the default model
        with int8, a /retry over the cached prompt gave the same tokens with logprobs up to
        0.13 nats apart (now equal to the last bit). It costs a step's weight read: the
        default model's 138-token prompt took 129 ms to its first logits against 124 (int8,
        two cores, median of 25)."""
        if self._cache is None:
            self._cache = self.runner.new_cache()
            self._cache_ids = []
        logits = None
        pos = start
        total = len(ids) - start
        t0 = time.perf_counter()
        while pos < len(ids):
            if cancel.is_set():
                return None
            chunk = ids[pos: min(pos + self.prefill_chunk, len(ids) - 1)] or ids[pos:]
            x = torch.tensor([chunk], device=self.device)
            try:
                logits = self.runner.forward(self._cache, x, should_stop=cancel.is_set)
            except Interrupted:  # (Esc between two layers; the cache holds what came before)
                return None
            except BaseException:
                self.reset()
                raise
            self._cache_ids.extend(chunk)
            pos += len(chunk)
            if total > self.prefill_chunk and pos != len(ids) - 1:  # (the last token: next)
                yield PromptProgress(pos - start, total, time.perf_counter() - t0)
        return logits

    # ---- scoring ----

    def score(self, request: ScoreRequest, cancel: threading.Event) -> Iterator[Event]:
        """Score ``request.text``: one prefill in chunks of ``prefill_chunk`` over a fresh cache
        (the conversation's cache is left alone), every position's logits through the decode
        path's ``token_stats``. Yields ``PromptProgress`` per chunk for long texts, then
        ``Scored`` (nothing when cancelled)."""
        if request.context is not None:
            yield from self._score_after(request, cancel)
            return
        ids = list(self.tokenizer(request.text, add_special_tokens=True)["input_ids"])
        limit = self.info.context_limit
        if len(ids) > limit:
            yield Failed(f"The text is too long to score: it takes {len(ids)} tokens and the "
                         f"model's context holds {limit}.")
            return
        k = request.top_logprobs
        cache = self.runner.new_cache()
        rows: list[list[float]] = []
        t0 = time.perf_counter()
        pos = 0
        while pos < len(ids):
            if cancel.is_set():
                return
            chunk = ids[pos: pos + self.prefill_chunk]
            x = torch.tensor([chunk], device=self.device)
            try:
                logits = self.runner.forward(cache, x, all_logits=True,
                                             should_stop=cancel.is_set)[0]  # [T, V]
            except Interrupted:  # (its own cache: nothing to keep)
                return
            end = pos + len(chunk)
            targets = ids[pos + 1: end + 1]  # the last position of the text predicts nothing
            if targets:
                t = torch.tensor(targets, device=self.device)
                rows += score_stats(logits[: len(targets)], t, k).cpu().tolist()
            pos = end
            if len(ids) > self.prefill_chunk:
                yield PromptProgress(pos, len(ids), time.perf_counter() - t0)
        del cache
        yield self._scored(ids, rows, k)

    def _score_after(self, request: ScoreRequest, cancel: threading.Event) -> Iterator[Event]:
        """Score ``request.text`` as the continuation of ``request.context`` (``/probe``): the
        context prefilled in chunks on a fresh cache (all but its last token), then one forward
        over its last token and the text's tokens gives every text token's statistics."""
        assert request.context is not None
        limit = self.info.context_limit
        text_ids = list(self.tokenizer(request.text, add_special_tokens=False)["input_ids"])
        if not text_ids:
            yield Failed("The text to probe encodes to no tokens.")
            return
        try:
            enc = encode_request(self.tokenizer, request.context, limit - len(text_ids),
                                 self.own_prefix(request.prefix), request.raw)
        except PromptTooLongError:
            yield Failed(f"The conversation up to there and the text to probe take more than "
                         f"the model's context of {limit} tokens.")
            return
        ctx = enc.ids
        if not ctx:
            yield Failed("There is nothing before the text to probe it after.")
            return
        k = request.top_logprobs
        cache = self.runner.new_cache()
        t0 = time.perf_counter()
        for pos in range(0, len(ctx) - 1, self.prefill_chunk):
            if cancel.is_set():
                return
            chunk = ctx[pos: min(pos + self.prefill_chunk, len(ctx) - 1)]
            try:
                self.runner.forward(cache, torch.tensor([chunk], device=self.device),
                                    should_stop=cancel.is_set)
            except Interrupted:
                return
            if len(ctx) > self.prefill_chunk:
                yield PromptProgress(pos + len(chunk), len(ctx), time.perf_counter() - t0)
        x = torch.tensor([ctx[-1:] + text_ids[:-1]], device=self.device)
        logits = self.runner.forward(cache, x, all_logits=True)[0]  # [n, V]
        t = torch.tensor(text_ids, device=self.device)
        rows = score_stats(logits[: len(text_ids)], t, k).cpu().tolist()
        del cache
        yield self._scored(text_ids, rows, k, first_scored=True)

    def _scored(self, ids: list[int], rows: list[list[float]], k: int, *,
                first_scored: bool = False) -> Scored:
        """Token events for the ids of a scored text; ``rows[i]`` scores ``ids[i + 1]`` (or
        ``ids[i]`` with ``first_scored``: the text followed a context)."""
        detok = self._detokenizer()
        fed: list[int] = []  # the position of each token the detokenizer saw
        tokens: list[Token] = []
        ranks: list[int | None] = []
        for i, tid in enumerate(ids):
            stats = rows[i] if first_scored else (rows[i - 1] if i > 0 else None)
            special = tid in self.special_ids
            raw = self.piece_text(tid)
            if special:
                text, start = "", None
            else:
                fed.append(i)
                piece = detok.step(tid)
                text = piece.text
                start = None if piece.glyph_start is None else fed[piece.glyph_start]
            if stats is None:
                lp = ent = None
                top: tuple[Alternative, ...] = ()
                ranks.append(None)
            else:
                lp, ent = float(stats[1]), float(stats[2])
                top = tuple(Alternative(int(stats[3 + j]), self.piece_text(int(stats[3 + j])),
                                        float(stats[3 + k + j])) for j in range(k))
                ranks.append(int(stats[3 + 2 * k]))
            tokens.append(Token(i, tid, text, lp, ent, top, special, start, raw))
        rest = detok.flush() if detok.pending else ""
        if rest and tokens:  # an incomplete glyph at the end: its bytes go to the last token
            tokens[-1] = _with_text(tokens[-1], tokens[-1].text + rest)
        return Scored(tuple(tokens), tuple(ranks))

    # ---- generation ----

    def _prompt_budget(self, settings: Sequence[SamplingParams]) -> int:
        """Tokens the prompt may take: the context less room for the reply (at most a
        quarter of the context is kept for it, so long chats keep their recent turns)."""
        limit = self.info.context_limit
        return limit - min(max(s.max_new_tokens for s in settings), max(limit // 4, 1))

    def generate(self, request: GenerationRequest, cancel: threading.Event) -> Iterator[Event]:
        t0 = time.perf_counter()
        checked = self._checked(request)
        if isinstance(checked, str):
            yield Failed(checked)
            return
        request = checked
        settings = request.settings
        limit = self.info.context_limit
        try:
            enc = encode_request(self.tokenizer, request.messages,
                                 self._prompt_budget(settings), request.prefix, request.raw,
                                 self._template_options(request), limit)
        except PromptTooLongError as exc:
            yield Failed(str(exc))
            return
        ids = enc.ids
        cached = self._reuse_prefix(ids)
        yield Started(rows=len(settings), prompt_tokens=len(ids), cached_tokens=cached,
                      dropped_messages=enc.dropped_messages, context_limit=limit)
        logits = yield from self._prefill_steps(ids, cached, cancel)
        n = len(settings)
        if logits is None:  # cancelled during prefill
            for r in range(n):
                yield RowDone(r, "cancelled", "", Usage(len(ids), 0, cached, 0.0, 0.0))
            return
        if n == 1:
            cache, shared = self._cache, True
        else:
            room = min(limit, len(ids) + max(s.max_new_tokens for s in settings))
            cache, shared = _repeated(self._cache, n, room, self._pool), False
            holds = getattr(cache, "holds_memory_of", None)
            if (self.device.type == "cpu" and holds is not None and not holds(self._pool)
                    and cache.nbytes <= POOL_BYTES):
                self._pool = cache.memory()  # (the one it replaces was too small)
            logits = logits.expand(n, -1)
        try:
            yield from self._decode(cache, logits, [ids] * n, settings, request.top_logprobs,
                                    cancel, t0=t0, cached=cached, track_cache=shared,
                                    first_tokens=request.first_tokens, raw=request.raw,
                                    continued=len(request.prefix.token_ids or ())
                                    if request.prefix is not None else 0,
                                    prefix_ids=request.prefix.token_ids or ()
                                    if request.prefix is not None else ())
        except BaseException:
            if shared:
                self.reset()
            raise

    def generate_batch(self, requests: Sequence[GenerationRequest],
                       cancel: threading.Event) -> Iterator[Event]:
        """Different conversations in one left-padded batch (row i = request i, first settings
        row of each). A request that cannot be answered (too long for the context) ends as
        its row's ``RowDone`` with ``error``, and the others are answered (one long line of a
        `chatui batch` file failed the whole file, with nothing written). Does not touch the
        conversation cache."""
        t0 = time.perf_counter()
        limit = self.info.context_limit
        prompts, settings, kept = [], [], []
        for r, req in enumerate(requests):
            s = req.settings[0]
            checked = self._checked(req)
            if not isinstance(checked, str):
                try:
                    enc = encode_request(self.tokenizer, checked.messages,
                                         self._prompt_budget((s,)), checked.prefix,
                                         checked.raw, self._template_options(checked))
                except PromptTooLongError as exc:
                    checked = str(exc)
            if isinstance(checked, str):  # this row alone fails: the others are answered
                yield RowDone(r, "error", "", Usage(0, 0, 0, 0.0, 0.0), error=checked)
                continue
            prompts.append(enc.ids)
            settings.append(s)
            kept.append(r)
        if not prompts:
            return
        yield from self._rows_renumbered(self._batch_rows(
            [requests[r] for r in kept], prompts, settings, cancel, t0, limit), kept)

    @staticmethod
    def _rows_renumbered(events: Iterator[Event], rows: list[int]) -> Iterator[Event]:
        """``events`` of a batch of some requests, each row numbered as its request."""
        for ev in events:
            if isinstance(ev, (TokenBatch, RowDone)):
                ev = dataclasses.replace(ev, row=rows[ev.row])
            yield ev

    def _batch_rows(self, requests: Sequence[GenerationRequest], prompts: list[list[int]],
                    settings: list[SamplingParams], cancel: threading.Event, t0: float,
                    limit: int) -> Iterator[Event]:
        """``generate_batch``'s rows that encoded, as one left-padded batch."""
        width = max(len(p) for p in prompts)
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts],
                            device=self.device)
        yield Started(rows=len(prompts), prompt_tokens=sum(len(p) for p in prompts),
                      cached_tokens=0, context_limit=limit)
        cache = self.runner.new_cache()
        if isinstance(cache, StaticKVCache):
            cache, logits = self._prefill_apart(prompts, mask, cancel)
            if logits is None:  # cancelled during prefill
                for r, ids in enumerate(prompts):
                    yield RowDone(r, "cancelled", "", Usage(len(ids), 0, 0, 0.0, 0.0))
                return
        else:  # (transformers' modules: one forward of the padded prompts)
            pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
            x = torch.tensor([[pad] * (width - len(p)) + p for p in prompts], device=self.device)
            logits = self.runner.forward(cache, x, attention_mask=mask,
                                         position_ids=(mask.cumsum(-1) - 1).clamp(min=0))
        k = max(r.top_logprobs for r in requests)
        yield from self._decode(cache, logits, prompts, settings, k, cancel, t0=t0, cached=0,
                                track_cache=False, mask=mask,
                                raw=any(r.raw for r in requests))

    def _prefill_apart(self, prompts: Sequence[list[int]], mask: torch.Tensor,
                       cancel: threading.Event) -> tuple[Any, torch.Tensor | None]:
        """A batch's prompts prefilled one by one as ``_prefill_steps`` prefills one (all but
        the last token, in the same chunks), stacked left-padded, then their last tokens as
        one step: each row's cache and first logits are then what ``chatui generate`` gets
        for its prompt, to the bit, and so are its replies (one forward of the padded prompts
        took torch's masked attention, whose other rounding int8's activations can turn into
        another level: "Name three colors." at temperature 0 began "1. Red" in a batch and
        "The most obvious color" alone). (None, None) if cancelled."""
        rows = []
        for ids in prompts:
            one = self.runner.new_cache()
            for pos in range(0, len(ids) - 1, self.prefill_chunk):
                if cancel.is_set():
                    return None, None
                chunk = ids[pos: min(pos + self.prefill_chunk, len(ids) - 1)]
                self.runner.forward(one, torch.tensor([chunk], device=self.device))
            rows.append(one)
        cache = StaticKVCache.stacked(rows, mask.shape[1] - 1)
        last = torch.tensor([[ids[-1]] for ids in prompts], device=self.device)
        where = torch.tensor([[len(ids) - 1] for ids in prompts], device=self.device)
        return cache, self.runner.forward(cache, last, attention_mask=mask, position_ids=where)

    def _template_options(self, request: GenerationRequest) -> TemplateOptions:
        """The template's reasoning switch and history key for ``request``."""
        fmt = self.reasoning
        if fmt is None:
            return TemplateOptions()
        return TemplateOptions(thinking=request.thinking if fmt.switch else None,
                               reasoning_key=fmt.history_key)

    def _splitters(self, prompts: Sequence[list[int]], raw: bool, continued: int
                   ) -> list[ChannelSplitter | None]:
        """One splitter per row, each fed its prompt (None without reasoning markers). The
        last ``continued`` ids of a prompt are the reply's own (a continued reply): only
        they count towards the reasoning budget, not a template's ``<think>\n``."""
        if self.reasoning is None or raw:
            return [None] * len(prompts)
        out: list[ChannelSplitter | None] = []
        fed: dict[int, ChannelSplitter] = {}
        for p in prompts:
            base = fed.get(id(p))
            if base is None:
                base = fed[id(p)] = ChannelSplitter(self.reasoning, self._decode_plain)
                cut = len(p) - continued
                base.feed_prompt(p[:cut])
                base.reasoning_tokens = 0
                base.feed_prompt(p[cut:])
            out.append(base.clone())
        return out

    def _decode_plain(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True,
                                     clean_up_tokenization_spaces=False)

    def _budget_force(self, row: _Row) -> None:
        """Queue the closing marker when the row's reasoning has used its budget."""
        budget = row.settings.reasoning_budget
        split = row.split
        if (budget is None or split is None or row.budget_spent or row.force
                or split.channel != "reasoning" or split.holding
                or split.reasoning_tokens < budget or self.reasoning is None):
            return
        row.budget_spent = True
        row.force = list(self.reasoning.close_ids)

    def _decode(self, cache: Any, logits: torch.Tensor, prompts: Sequence[list[int]],
                settings: Sequence[SamplingParams], k: int, cancel: threading.Event, *,
                t0: float, cached: int, track_cache: bool,
                mask: torch.Tensor | None = None,
                first_tokens: Sequence[int] | None = None, raw: bool = False,
                continued: int = 0, prefix_ids: Sequence[int] = ()) -> Iterator[Event]:
        """The decode loop shared by every entry point. logits: [B, V] for the first step;
        ``first_tokens``: each row's first token, forced instead of sampled (fan-out);
        ``prefix_ids``: the reply's own ids before this request (a continued reply)."""
        n = len(settings)
        rows = [_Row(s, self._detokenizer(), StopStringFilter(s.stop), len(p), split=split)
                for s, p, split in zip(settings, prompts,
                                       self._splitters(prompts, raw, continued))]
        glyph = self._glyph_tail(prefix_ids)  # (the same prefix for every row: found once)
        for row in rows:
            self._budget_force(row)
            if glyph:
                row.detok, row.fed = self._primed(glyph), list(range(-len(glyph), 0))
        active = list(range(n))
        sampling = RowSampling.build(settings, self.device)
        seen = None
        if sampling.any_penalty:
            seen = torch.zeros(n, logits.shape[-1], dtype=torch.bool, device=self.device)
            for b, p in enumerate(prompts):
                seen[b, torch.tensor(p, device=self.device)] = True
        positions = None
        if mask is not None:
            positions = mask.sum(-1, keepdim=True)  # [B, 1] next position per row
        limit = self.info.context_limit
        cuda = self.device.type == "cuda"
        pipeline = cuda if self.pipeline is None else self.pipeline
        tuner = self.threads

        def advance(ids: torch.Tensor) -> torch.Tensor:
            """Feed the chosen ids [B]; returns the next logits (the cache grows by one)."""
            nonlocal mask, positions
            if seen is not None:
                seen.scatter_(1, ids[:, None], True)
            if mask is not None:
                mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=-1)
            if tuner is None:
                out = self.runner.forward(cache, ids[:, None], attention_mask=mask,
                                          position_ids=positions)
            else:
                tuner.before_step()
                started = time.perf_counter()
                out = self.runner.forward(cache, ids[:, None], attention_mask=mask,
                                          position_ids=positions)
                tuner.after_step(time.perf_counter() - started, ids.shape[0])
            if positions is not None:
                positions = positions + 1
            return out

        forced = (None if first_tokens is None
                  else torch.tensor(list(first_tokens), device=self.device))
        if tuner is not None:
            tuner.begin()
        while active:
            if forced is not None:  # the branches' first tokens, scored as sampled ones are
                next_ids, stats = forced, token_stats(logits.float(), forced, k)
                forced = None
            else:
                next_ids, stats = decode_step_outputs(logits, seen, sampling, k)
            if any(rows[r].force for r in active):  # a reasoning budget ends the reasoning
                ids_now = next_ids.tolist()
                for b, r in enumerate(active):
                    if rows[r].force:
                        ids_now[b] = rows[r].force.pop(0)
                next_ids = torch.tensor(ids_now, device=self.device)
                stats = token_stats(logits.float(), next_ids, k)
            if pipeline:
                # Queue the next step before reading this one: the device computes token t + 1
                # while the host turns token t into events (one wasted step when a row ends,
                # and then the cache also holds the last token, which _cache_ids records).
                if cuda:
                    buf = torch.empty(stats.shape, dtype=stats.dtype, pin_memory=True)
                    buf.copy_(stats, non_blocking=True)
                    copied = torch.cuda.Event()
                    copied.record()
                else:
                    buf = stats
                ahead = advance(next_ids)
                if cuda:
                    copied.synchronize()
                host = buf.tolist()  # the one transfer per step
                if track_cache:
                    self._cache_ids.append(int(host[0][0]))
            else:
                host = stats.cpu().tolist()  # the one transfer per step
            now = time.perf_counter()
            finished: list[int] = []
            for b, r in enumerate(active):
                row = rows[r]
                events, reason = self._accept(r, row, host[b], k, now)
                yield from events
                if reason is None and cancel.is_set():
                    reason = "cancelled"
                if reason is None and row.prompt_len + row.generated >= limit:
                    reason = "length"
                if reason is not None:
                    finished.append(b)
                    yield from self._finish(r, row, reason, cached, t0)
            if len(finished) == len(active):
                break
            if cancel.is_set():
                for b, r in enumerate(active):
                    if b not in finished:
                        yield from self._finish(r, rows[r], "cancelled", cached, t0)
                break
            if finished:
                keep = [b for b in range(len(active)) if b not in finished]
                idx = torch.tensor(keep, device=self.device)
                cache.batch_select_indices(idx)
                next_ids = next_ids[idx]
                sampling = sampling.select(idx, keep)
                if seen is not None:
                    seen = seen[idx]
                if mask is not None:
                    mask = mask[idx]
                    positions = positions[idx] if positions is not None else None
                if pipeline:
                    ahead = ahead[idx]
                active = [active[b] for b in keep]
            if pipeline:
                logits = ahead
                continue
            logits = advance(next_ids)
            if track_cache:
                self._cache_ids.append(int(host[0][0]))
        if tuner is not None:
            tuner.end()  # a comparison cut short: the next prefill runs with the chosen count

    def _accept(self, r: int, row: _Row, stats: list[float], k: int,
                now: float) -> tuple[list[Event], str | None]:
        """Turn one row's step statistics into token events; returns (events, finish reason)."""
        tid = int(stats[0])
        ids = [int(i) for i in stats[3:3 + k]]
        top = tuple(map(Alternative, ids, map(self.piece_text, ids), stats[3 + k:3 + 2 * k]))
        index = row.generated
        row.generated += 1
        row.first_at = row.first_at or now
        row.last_at = now
        is_eos = tid in self.eos_ids
        special = is_eos or tid in self.special_ids
        raw = self.piece_text(tid)
        tok = Token(index, tid, "", float(stats[1]), float(stats[2]), top, special, None, raw,
                    sampler=_sampler_cut(stats, k))
        if row.split is None:
            out = self._place(row, tok)
        else:
            decisions = row.split.push(tid)
            out = []
            if not decisions:  # held back: a marker whose channel its header decides
                row.held.append(tok)
            else:
                for t, d in zip(row.held + [tok], decisions):
                    t = dataclasses.replace(t, channel=d.channel, special=t.special or d.marker)
                    out += self._place(row, t, marker=d.marker)
                row.held = []
            self._budget_force(row)
        events: list[Event] = []
        released: list[Token] = []
        stopped = False
        for t in out:
            if t.channel == "reasoning":  # the stop strings watch the answer only
                released += [v.token for v in row.stops.flush()]
                released.append(t)
                continue
            res = row.stops.push(_TokenView(t))
            released += [v.token for v in res.released]
            if res.stopped:
                stopped = True
                break
        if released:
            events.append(TokenBatch(r, tuple(released)))
        if is_eos or stopped:
            return events, "stop"
        if row.generated >= row.settings.max_new_tokens:
            return events, "length"
        return events, None

    def _place(self, row: _Row, tok: Token, *, marker: bool = False) -> list[Token]:
        """Give ``tok`` its text; returns the tokens now ready, in order (an incomplete
        glyph's tokens wait for the one that completes it). A reasoning marker ends the
        channel's text: a glyph left incomplete before it is flushed into its own tokens
        (never carried over into the other channel), and the next channel's text starts
        afresh."""
        if tok.special:
            if not marker and tok.channel == "answer":
                out = row.glyph + [tok]  # (as before reasoning existed)
                row.glyph = []
                return out
            out = self._flush_glyph(row) + [tok]
            row.detok = self._detokenizer()
            row.fed = []
            return out
        row.fed.append(tok.index)
        piece = row.detok.step(tok.id)
        start = None if piece.glyph_start is None else row.fed[piece.glyph_start]
        tok = _placed(tok, piece.text, start)
        if piece.text == "" and row.detok.pending:
            row.glyph.append(tok)  # an incomplete glyph: wait for the token that completes it
            return []
        out = row.glyph + [tok]
        row.glyph = []
        return out

    def _glyph_tail(self, prefix_ids: Sequence[int]) -> list[int]:
        """The last ids of a continued reply when it ended inside a glyph (cut off by the
        length limit or stopped between the tokens of an emoji or a CJK character; its tokens
        kept "" for text, see :meth:`_finish`), else []. Each row's detokenizer then starts
        with them (:meth:`_primed`), so that the token completing the glyph brings all of it,
        its ``glyph_start`` on the first of them (positions before this request are negative
        here, the reply's once the recorder numbers them). A fresh detokenizer decoded the
        rest of the glyph's bytes alone, and a continued emoji came out as two replacement
        characters."""
        tail: list[int] = []
        for tid in reversed(prefix_ids[-8:]):  # (a glyph is at most 4 bytes, a token 1+)
            if tid in self.special_ids:
                break
            tail.insert(0, tid)
        return tail if tail and self._primed(tail).pending else []

    def _primed(self, ids: Sequence[int]) -> IncrementalDetokenizer:
        """A detokenizer that has seen ``ids``."""
        detok = self._detokenizer()
        for tid in ids:
            detok.step(tid)
        return detok

    def _flush_glyph(self, row: _Row) -> list[Token]:
        """The tokens of an incomplete glyph, its bytes given to the last of them."""
        if not row.glyph:
            return []
        rest = row.detok.flush()
        first, last = row.glyph[0].index, row.glyph[-1]
        row.glyph[-1] = dataclasses.replace(
            last, text=rest, glyph_start=first if first < last.index else None)
        out, row.glyph = row.glyph, []
        return out

    def _finish(self, r: int, row: _Row, reason: str, cached: int, t0: float) -> Iterator[Event]:
        if row.done:
            return
        row.done = True
        released: list[Token] = []
        # an incomplete glyph at the end: its bytes go to its last token, unless the reply
        # was cut off or stopped (it may be continued, and the glyph completed then: its
        # tokens keep "" and no replacement character is shown); then the markers of a
        # header cut short
        if reason in ("length", "cancelled") and row.glyph:
            pending, row.glyph = row.glyph, []
        else:
            pending = self._flush_glyph(row)
        if row.split is not None and row.held:
            pending += [dataclasses.replace(t, channel=d.channel, special=True)
                        for t, d in zip(row.held, row.split.flush())]
            row.held = []
        for t in pending:
            if t.channel == "reasoning":
                released += [v.token for v in row.stops.flush()] + [t]
            else:
                released += [v.token for v in row.stops.push(_TokenView(t)).released]
        released += [v.token for v in row.stops.flush()]  # text held back for a stop string
        if released:
            yield TokenBatch(r, tuple(released))
        ttft = (row.first_at - t0) if row.first_at else time.perf_counter() - t0
        span = (row.last_at - row.first_at) if row.first_at and row.last_at else 0.0
        tps = (row.generated - 1) / span if row.generated > 1 and span > 0 else 0.0
        yield RowDone(r, reason, row.stops.released_text,  # type: ignore[arg-type]
                      Usage(row.prompt_len, row.generated, cached, ttft, tps,
                            self.info.context_limit))


def _vocab_size(runner: Any, model: Any, tokenizer: Any) -> int:
    """The model's vocabulary: its embedding table's rows (the fast runner's, else the
    module's), or the tokenizer's where neither says."""
    size = getattr(runner, "vocab", None)
    if size is None and model is not None:
        embeddings = getattr(model, "get_input_embeddings", lambda: None)()
        size = getattr(embeddings, "num_embeddings", None)
    return int(size) if size else len(tokenizer)


def _byte_spelling(tokenizer: Any, token_id: int) -> str | None:
    """'<0xE4>'-style spelling of a token that is a partial UTF-8 sequence."""
    try:
        tok = tokenizer.convert_ids_to_tokens(token_id)
    except Exception:  # noqa: BLE001
        return None
    if isinstance(tok, str) and tok.startswith("<0x"):
        return tok
    inverse = _byte_level_bytes()
    if isinstance(tok, str) and all(ch in inverse for ch in tok):
        return "".join(f"<0x{inverse[ch]:02X}>" for ch in tok)
    return tok


@functools.cache
def _byte_level_bytes() -> dict[str, int]:
    """Byte-level BPE's alphabet (GPT-2's): each of the 256 bytes spelled as a printable
    character, inverted. Written out here: transformers 5 moved its ``bytes_to_unicode`` out
    of the GPT-2 tokenizer's module, and the import that read it failed quietly, so a partial
    emoji's alternative showed as 'ðŁ' instead of '<0xF0><0x9F>'."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
                 *range(ord("®"), ord("ÿ") + 1)]
    spelled = {b: chr(b) for b in printable}
    others = (b for b in range(256) if b not in spelled)
    spelled.update((b, chr(256 + n)) for n, b in enumerate(others))
    return {ch: b for b, ch in spelled.items()}
