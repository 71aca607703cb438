"""Reading a text file the user named on the command line (a prompt file, a batch input file):
one reader, so every such input refuses a missing, unreadable, binary or non-UTF-8 file with
the same one sentence instead of a traceback.
"""

from __future__ import annotations

from pathlib import Path


class TextFileError(Exception):
    """A text input that cannot be used; the message is one sentence naming the file."""


def read_text_file(path: Path, what: str) -> str:
    """The file's text (UTF-8; a leading byte-order mark is dropped, as editors on Windows
    write one and it would otherwise start the first prompt).

    Args:
        path: the file the user named.
        what: how the message names it, e.g. "the prompt file".

    Raises:
        TextFileError: the file cannot be read, holds NUL bytes (a binary file), or is not
            UTF-8.
    """
    try:
        data = path.read_bytes()
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise TextFileError(f"cannot read {what} {path}: {reason}") from None
    return decode_text(data, f"{what} {path}")


def decode_text(data: bytes, what: str) -> str:
    """``data`` as text, checked as :func:`read_text_file` checks a file's bytes (``what``
    names them in the message: "the prompt file notes.txt", "standard input")."""
    if b"\x00" in data:
        raise TextFileError(f"{what} is a binary file, not text")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise TextFileError(f"{what} is not UTF-8 text (byte {exc.start} cannot be "
                            "decoded); convert it to UTF-8") from None
