"""Whether chatui's patches to Textual's private internals are on.

Every patch in :mod:`chatui.textual_compat` relies on how one Textual release works inside (a
private method's name and contract, a cache's key, a compositor's fields), not on its public
API. Each was read and tested against the releases in :data:`TESTED_VERSIONS`; on any other
release they are skipped and the UI takes Textual's public path: slower (more layouts and
repaints per streamed frame, longer garbage-collector pauses), never wrong.

The environment variable :data:`ENV_VAR` overrides the gate: ``off`` skips every patch (to
tell whether a display bug is ours or Textual's), ``force`` applies them on an untested
release (to try one before adding it to :data:`TESTED_VERSIONS` and the pin in
``pyproject.toml``). The decision is taken once, when this module is first imported: the
widget classes are built from it.
"""

from __future__ import annotations

import logging
import os
from typing import Mapping

import textual

log = logging.getLogger(__name__)

ENV_VAR = "CHATUI_TEXTUAL_PATCHES"
"""``off`` (also ``0``, ``no``, ``false``): no patch; ``force``: patch any release."""

TESTED_VERSIONS: frozenset[str] = frozenset({"8.2.8"})
"""Textual releases the patches were read against and the test suite passed on, patches on
and off (keep ``pyproject.toml``'s pin to these)."""

_OFF = frozenset({"off", "0", "no", "false"})
_FORCE = frozenset({"force"})


def textual_version() -> str:
    """The installed Textual's version ("" where it cannot be told)."""
    try:
        return str(textual.__version__)
    except Exception:  # noqa: BLE001 - a broken install's metadata: treat as untested
        return ""


def patches_enabled(version: str, setting: str | None) -> bool:
    """Whether to patch Textual ``version`` given the environment's ``setting`` (or None).

    >>> patches_enabled("8.2.8", None), patches_enabled("8.3.0", None)
    (True, False)
    >>> patches_enabled("8.2.8", "off"), patches_enabled("8.3.0", "force")
    (False, True)
    """
    choice = (setting or "").strip().lower()
    if choice in _OFF:
        return False
    if choice in _FORCE:
        return True
    return version in TESTED_VERSIONS


def decide(environ: Mapping[str, str] = os.environ) -> bool:
    """The decision for this process, logged once."""
    version, setting = textual_version(), environ.get(ENV_VAR)
    enabled = patches_enabled(version, setting)
    if enabled:
        log.debug("textual %s: chatui's patches on", version)
    else:
        log.info("textual %s: chatui's patches to Textual's internals off (%s)", version,
                 f"{ENV_VAR}={setting}" if setting else
                 f"tested on {', '.join(sorted(TESTED_VERSIONS))}")
    return enabled


ENABLED: bool = decide()
"""Whether this process patches Textual (decided at import)."""
