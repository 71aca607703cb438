"""A TextArea that can be drawn at any width and undone at any height.

Two ways Textual 8.2.8's TextArea stopped the app, each with a test:

- It folds its placeholder to the width of its content, and Rich raises ("range() arg 3
  must not be zero") when that width is 0: the notebook's empty text box did that when a
  terminal was narrowed to a few columns (tests/test_resize.py). An empty box with no room
  for a single cell now draws nothing instead.
- Its undo refreshes the box's size before it puts the cursor back: when the undone edit
  took away the line that had made the vertical scrollbar appear (a newline typed under
  eight lines in the message box, then Ctrl+Z), the scrollbar's going asked to show a cursor
  still on that line ("The document line index 8 is out of bounds"). That request is now
  left out; the undo then puts the cursor back and shows it (tests/test_monkey.py).
"""

from __future__ import annotations

from textual.geometry import Offset
from textual.strip import Strip
from textual.widgets import TextArea


class TextBox(TextArea):
    """:class:`~textual.widgets.TextArea`, safe at a width of 0 and in an undo that takes
    its scrollbar away (see the module docstring)."""

    def scroll_cursor_visible(self, center: bool = False, animate: bool = False) -> Offset:
        if self.selection.end[0] >= self.document.line_count:  # mid-undo: see the docstring
            return Offset(0, 0)
        return super().scroll_cursor_visible(center, animate)

    def render_line(self, y: int) -> Strip:
        if self.content_size.width <= 0 and not self.text and self.placeholder:
            return Strip.blank(0)
        return super().render_line(y)


__all__ = ["TextBox"]
