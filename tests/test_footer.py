"""ChatFooter: the footer lets go of the keys it replaced (Textual 8's Footer keeps them)."""

from __future__ import annotations

import gc

from textual.app import App, ComposeResult


async def test_footer_lets_its_old_keys_go():
    """Textual 8's Footer keeps every FooterKey it ever made (see chatui.widgets.footer)."""
    from textual.binding import Binding
    from textual.widgets import Footer

    from chatui.widgets.footer import ChatFooter

    class WithFooter(App[None]):
        BINDINGS = [Binding("f5", "noop", "One"), Binding("f6", "noop", "Two")]

        def __init__(self, footer: type[Footer]) -> None:
            super().__init__()
            self.footer = footer

        def compose(self) -> ComposeResult:
            yield self.footer()

    def count() -> int:
        gc.collect()
        return sum(type(o).__name__ == "FooterKey" for o in gc.get_objects())  # (a private class)

    async def keys_alive(footer: type[Footer]) -> int:
        """Footer keys this app made that are still alive (other tests' apps may have left
        some of their own)."""
        before = count()
        app = WithFooter(footer)
        async with app.run_test() as pilot:
            for _ in range(10):  # what each change of the screen's bindings does
                footer = app.query_one(Footer)
                footer.call_later(footer.recompose)
                await pilot.pause()
                await pilot.pause()
            return count() - before

    ours, textuals = await keys_alive(ChatFooter), await keys_alive(Footer)
    assert ours <= 3  # the keys on screen
    assert textuals >= ours + 8  # Textual's own leaks: if this fails, drop ChatFooter
