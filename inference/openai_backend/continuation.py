"""Whether a server continues a partial reply.

A reply is continued by sending it as a final assistant message with
``continue_final_message: true, add_generation_prompt: false`` (vLLM, SGLang, recent
llama-server). A server that ignores the two fields (llama-cpp-python's 0.3.36, TGI) closes
that message and opens a new assistant turn: the "continuation" is a new reply, and it was shown
joined to the old one ("...bread was not only a meal butBread is a humble...": found using
chatui in tmux against llama-cpp-python's server).

The two cases differ in the prompt the server builds, which it counts in ``usage``: the same
short exchange sent once with the fields and once without them (a closed message and a new
turn) is shorter with them where they are honoured (no end-of-turn token and no new header;
Mistral's template, which has no generation header, still loses its ``</s>``), and exactly as
long where they are ignored. So two one-token requests, once per backend, tell them apart with
no threshold to guess; a server that answers them without ``usage`` (or not at all) is not
judged, and its continuations are sent as before.
"""

from __future__ import annotations

from typing import Any

import httpx

from .transport import Server

PROBE = ({"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"})

CONTINUE_UNSUPPORTED = (
    "This server does not continue a reply: it ignores continue_final_message and would start "
    "a new reply after it (llama-cpp-python's and TGI's servers do); /retry asks again, and "
    "vLLM, SGLang or a recent llama-server continue replies.")


def continues_replies(server: Server) -> bool | None:
    """Whether ``server`` honours ``continue_final_message`` (None: its answers do not say);
    asked once, then remembered on the server."""
    if server.asked_continues:
        return server.continues
    opened = _prompt_tokens(server, {"continue_final_message": True,
                                     "add_generation_prompt": False})
    closed = _prompt_tokens(server, {}) if opened is not None else None
    server.continues = None if opened is None or closed is None else opened < closed
    server.asked_continues = True
    return server.continues


def _prompt_tokens(server: Server, fields: dict[str, Any]) -> int | None:
    """The prompt tokens the server counts for :data:`PROBE` sent with ``fields``."""
    body = {"model": server.model, "messages": list(PROBE), "max_tokens": 1,
            "temperature": 0, "stream": False, **fields}
    try:
        response = server.client.post(server.endpoint.api_root + "/chat/completions",
                                      json=body)
        usage = response.json().get("usage") if response.status_code < 400 else None
    except (httpx.HTTPError, ValueError, AttributeError):
        return None
    count = usage.get("prompt_tokens") if isinstance(usage, dict) else None
    return count if isinstance(count, int) and not isinstance(count, bool) else None
