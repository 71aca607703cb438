"""A backend that streams from an OpenAI-compatible server (vLLM, SGLang, TGI, llama.cpp).

One job per module: ``protocol`` (URLs, keys, request bodies, SSE and chunk mapping: no I/O),
``transport`` (the HTTP client, the model list, one streamed request, failures in words),
``rows`` (one thread per settings row, merged into one iterator), ``backend`` (the
``Backend`` protocol and the worker's factory).

``chatui --backend openai --base-url URL [--model NAME] [--api-key-env VAR]`` runs the same
TUI, token view, comparison and transcripts against a remote server: the worker drives this
backend like any other, and the app never knows where a token came from.

What maps to what:

* One settings row = one streaming ``POST /v1/chat/completions`` (``stream: true``,
  ``logprobs: true``, ``top_logprobs: k``). Compare mode sends the N rows as N concurrent
  requests (a thread each) and interleaves their events into the one iterator.
* Each ``logprobs.content`` entry becomes a :class:`Token` with its text, logprob and top-k
  :class:`Alternative` s. What a server cannot give is ``None``, never invented: token ids
  (``ModelInfo.has_token_ids`` is False), the entropy of the full distribution
  (``has_entropy`` is False), and the logprob itself when the server sends no logprobs.
* ``bytes`` fields are joined across tokens, so a glyph split over several tokens reaches the
  text whole (no U+FFFD): the earlier tokens carry ``""`` and the glyph's last token carries
  the glyph with ``glyph_start`` set to where it began.
* Sampling: ``temperature``, ``top_p``, ``seed``, ``max_tokens``, ``stop`` always; the common
  extensions ``top_k``, ``min_p`` and ``repetition_penalty`` (also sent as llama.cpp's
  ``repeat_penalty``) only when they differ from "disabled", so a server that lacks them
  still works with default settings and the server's own defaults apply otherwise.
* :class:`AssistantPrefix` (continue a partial reply) is sent as a final assistant message with
  ``continue_final_message: true, add_generation_prompt: false`` (vLLM, SGLang). The server
  re-encodes the text, so the continuation is text-exact but not token-exact: token-exact
  continuation (``AssistantPrefix.token_ids``) is only for the local engine. Servers that do
  not know these fields (llama-cpp-python, TGI) would start a new assistant turn instead: two
  one-token requests before the first continuation tell them apart (``continuation``), and
  such a server's continuations fail in one sentence. ``RowDone.text`` is the continuation
  only, like the local engine's.

Events and failures (one clear sentence each, nothing lost):

* ``Started`` first (prompt tokens estimated; the server's count comes in ``RowDone.usage``).
* A row that ends normally gets ``RowDone(row, "stop" | "length", text, usage)``; cancel
  (``cancel`` is polled every 50 ms, not only between chunks) closes that row's connection so
  the server stops generating, and the row ends with ``RowDone(row, "cancelled", partial)``.
* A row that fails (connection refused, timeout, 401/403, unknown model, a 4xx with the
  server's words, a 5xx, a stream cut mid-reply, a malformed event) gets no ``RowDone``: the
  tokens that arrived were already yielded, the other rows run to their end, and then one
  ``Failed(message, partial)`` comes last, where ``partial`` holds every row's text by row
  index (the finished rows' full text, the failed rows' partial text).
* Only ``GET /v1/models`` is retried (bounded, with backoff); a chat completion never is.

The API key is read from the environment variable named by ``--api-key-env`` when the backend
is built, and is never stored in :class:`ModelInfo`, transcripts or messages;
``ModelInfo.url`` is the base URL without ``user:pass@``.
"""

from __future__ import annotations

from .backend import OpenAIBackend, make_openai_factory
from .protocol import (ChunkMapper, Endpoint, OpenAIBackendError, chat_body, iter_sse_data,
                       parse_base_url, redact_url, sampling_fields, server_words)
from .transport import DEFAULT_TIMEOUT_S, MODELS_ATTEMPTS

__all__ = ["OpenAIBackend", "OpenAIBackendError", "make_openai_factory", "parse_base_url",
           "redact_url", "chat_body", "sampling_fields", "iter_sse_data", "ChunkMapper",
           "server_words", "Endpoint", "DEFAULT_TIMEOUT_S", "MODELS_ATTEMPTS"]
