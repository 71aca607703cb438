"""``OpenAIBackend``: the engine's ``Backend`` protocol over an OpenAI-compatible server
(``transport.Server``), its rows run by ``rows.generate_rows``."""

from __future__ import annotations

import math
import threading
from typing import Any, Iterator

from ..backend import BackendFactory, ProgressCallback
from ..types import Event, Failed, GenerationRequest, Message, ModelInfo, Progress, ScoreRequest
from .continuation import CONTINUE_UNSUPPORTED, continues_replies
from .protocol import parse_base_url
from .rows import generate_rows
from .scoring import score_over_openai
from .transport import DEFAULT_TIMEOUT_S, Server


class OpenAIBackend:
    """Streams chat completions from an OpenAI-compatible server. See the package docstring."""

    def __init__(self, base_url: str, model: str | None = None, api_key_env: str | None = None,
                 timeout_s: float = DEFAULT_TIMEOUT_S, *,
                 progress: ProgressCallback | None = None) -> None:
        self.endpoint = parse_base_url(base_url)
        self.api_key_env = api_key_env
        self.timeout_s = timeout_s
        self.server = Server(self.endpoint, api_key_env, timeout_s)
        try:
            if progress:
                progress(Progress(f"Connecting to {self.endpoint.display}", 0.0, 1.0))
            self.server.models = self.server.list_models(required=model is None)
            name = model or self.server.first_model_id()
            self.server.model = name
            entry = next((m for m in self.models if m.get("id") == name), {})
            context = entry.get("max_model_len") if isinstance(entry, dict) else None
            self.info = ModelInfo(
                name=name, backend="openai", device="server", dtype="unknown",
                context_limit=context if isinstance(context, int) and context > 0 else 0,
                checkpoint=name, has_token_ids=False, has_entropy=False,
                url=self.endpoint.display)
            if progress:
                progress(Progress(f"Connecting to {self.endpoint.display}", 1.0, 1.0))
        except BaseException:
            self.server.close()
            raise

    @property
    def models(self) -> list[dict[str, Any]]:
        """What ``GET /v1/models`` listed."""
        return self.server.models

    # -- Backend protocol --

    def count_tokens(self, messages: tuple[Message, ...]) -> int:
        """An estimate (4 characters a token, 4 tokens of framing a message): the OpenAI API
        has no tokenizer endpoint; the server's exact count arrives in ``RowDone.usage``."""
        return sum(math.ceil(len(m.content) / 4) + 4 for m in messages)

    def reset(self) -> None:
        """Nothing to drop: the server keeps no conversation for us."""

    def close(self) -> None:
        self.server.close()

    def generate(self, request: GenerationRequest, cancel: threading.Event) -> Iterator[Event]:
        if request.raw:
            return iter((Failed(RAW_UNSUPPORTED),))
        if request.prefix is not None and continues_replies(self.server) is False:
            return iter((Failed(CONTINUE_UNSUPPORTED),))
        return generate_rows(self.server, request, cancel, self.count_tokens,
                             self.info.context_limit)

    def score(self, request: ScoreRequest, cancel: threading.Event) -> Iterator[Event]:
        """vLLM's ``prompt_logprobs`` (``scoring``); a server without them gets one sentence."""
        return score_over_openai(self.server, request, cancel)


SCORE_UNSUPPORTED = ("Scoring a text needs the logprobs of the prompt's own tokens, which an "
                     "OpenAI-compatible server does not return; score with the local engine "
                     "(--backend local).")


RAW_UNSUPPORTED = ("Raw completion is not available over an OpenAI-compatible server yet (it "
                   "streams chat completions only); use the local engine (--backend local).")


def make_openai_factory(base_url: str, model: str | None, api_key_env: str | None,
                        timeout_s: float = DEFAULT_TIMEOUT_S) -> BackendFactory:
    """A factory for the worker: builds an :class:`OpenAIBackend` on the worker thread.

    Args:
        base_url: the server, e.g. ``http://127.0.0.1:8000`` or ``http://host:8000/v1``.
        model: the model name to ask for; None takes the first one ``GET /v1/models`` lists.
        api_key_env: the environment variable that holds the API key, or None for no key.
        timeout_s: longest wait for the server's next bytes (the first token included).

    The URL is checked at once (a bad URL raises :class:`OpenAIBackendError` here); the
    server is contacted when the worker calls the factory.
    """
    parse_base_url(base_url)

    def factory(progress: ProgressCallback) -> OpenAIBackend:
        return OpenAIBackend(base_url, model, api_key_env, timeout_s, progress=progress)

    return factory
