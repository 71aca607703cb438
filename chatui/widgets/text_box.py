"""A TextArea that can be drawn at any width.

Textual 8's TextArea folds its placeholder to the width of its content, and Rich raises
("range() arg 3 must not be zero") when that width is 0: the notebook's empty text box did
that when a terminal was narrowed to a few columns (tests/test_resize.py), and the app
stopped. An empty box with no room for a single cell now draws nothing instead.
"""

from __future__ import annotations

from textual.strip import Strip
from textual.widgets import TextArea


class TextBox(TextArea):
    """:class:`~textual.widgets.TextArea`, safe at a width of 0 (see the module docstring)."""

    def render_line(self, y: int) -> Strip:
        if self.content_size.width <= 0 and not self.text and self.placeholder:
            return Strip.blank(0)
        return super().render_line(y)


__all__ = ["TextBox"]
