"""The Markdown widget's block classes chatui needs, whichever Textual release is installed.

``MarkdownStream`` is public (:mod:`textual.widgets.markdown`). The paragraph and header block
classes are not: textual 8.2.8 defines them in the private ``textual.widgets._markdown``. Where
that import fails they are found through the public ``Markdown.BLOCKS`` table (the class that
renders ``paragraph_open``, the nearest common base of those that render ``h1`` to ``h6``).
"""

from __future__ import annotations

from textual.widgets import Markdown
from textual.widgets.markdown import MarkdownStream

__all__ = ["MarkdownHeader", "MarkdownParagraph", "MarkdownStream"]


def _common_base(classes: list[type]) -> type:
    """The most derived class every one of ``classes`` inherits from."""
    return next(base for base in classes[0].__mro__
                if all(issubclass(cls, base) for cls in classes))


def blocks_from_table(blocks: dict[str, type]) -> tuple[type, type]:
    """(paragraph class, header base class) from a ``Markdown.BLOCKS`` table."""
    return blocks["paragraph_open"], _common_base([blocks[f"h{n}"] for n in range(1, 7)])


try:
    from textual.widgets._markdown import MarkdownHeader, MarkdownParagraph
except (ImportError, AttributeError):  # a release that moved them: the public table
    MarkdownParagraph, MarkdownHeader = blocks_from_table(Markdown.BLOCKS)  # type: ignore[misc]
