"""Messages that widgets and screens post upwards (attributes down, messages up).

Each is a small dataclass with a one-line docstring. None is posted per token: token batches
are consumed by the chat screen directly and the views coalesce their own refreshes.
"""

from __future__ import annotations

from dataclasses import dataclass

from textual.message import Message


@dataclass
class PromptSubmitted(Message):
    """The user pressed Enter in the prompt box."""

    text: str


@dataclass
class PromptCleared(Message):
    """The user cleared the prompt box with its clear key (Ctrl+L). Deleting the text by
    typing is not this: retyping an edited message from an empty box is still the edit
    (seen in tmux: Ctrl+U then new text sent a new turn instead of the edit's branch)."""


@dataclass
class PageConversation(Message):
    """PageUp/PageDown in a prompt box with nothing to page through: page the conversation."""

    down: bool


@dataclass
class ResponseStarted(Message):
    """A reply began streaming (input that would conflict is locked)."""

    entry_index: int


@dataclass
class ResponseComplete(Message):
    """A reply ended (stop, length or cancelled)."""

    entry_index: int
    finish_reason: str


@dataclass
class ResponseFailed(Message):
    """A reply failed; the prompt text is given back to the box."""

    entry_index: int
    error: str


@dataclass
class TokenSelected(Message):
    """The token cursor of a reply view moved to ``unit`` (a glyph of one or more tokens)."""

    view_id: str
    unit: int


@dataclass
class FanOutRequested(Message):
    """The user asked to decode the top alternatives at ``token_index`` as branches in one
    batch (``f`` in the token view)."""

    view_id: str
    token_index: int


@dataclass
class AlternativeChosen(Message):
    """The user asked to regenerate a reply from ``token_index`` with alternative ``alt_rank``."""

    view_id: str
    token_index: int
    alt_rank: int



@dataclass
class ReplyChosen(Message):
    """The user chose another column of a comparison to continue with (the app saves)."""

    entry_index: int


@dataclass
class InputReady(Message):
    """The chat screen is mounted and its prompt box can take keys (posted once)."""


@dataclass
class SubmitSettled(Message):
    """What Enter in the message box sent has been taken up (a screen that a command opened
    is up and has drawn itself): the keys typed since may go where the focus is now
    (``ChatApp`` held them). ``hold``: the hold this ends (a timer's), None for the current
    one."""

    hold: int | None = None


@dataclass
class AutosaveBranched(Message):
    """An autosave was written as a branch: its file had changed elsewhere (posted from the
    autosaver's thread; the app then lets the conversation go on under the branch's id)."""


@dataclass
class AutosaveFailed(Message):
    """An autosave could not be written (posted from the autosaver's thread)."""

    error: Exception
