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


async def test_a_binding_only_enabled_or_disabled_greys_its_key_in_place():
    """Issue 21: Esc "Stop" and Ctrl+L "Clear box" are enabled and disabled four times an exchange;
    each rebuilt the footer (~20 keys mounted anew, 16-85 ms), and a key pressed meanwhile
    waited for it. The keys are now greyed in place and drawn as a footer composed anew
    draws them; a binding that comes or goes still recomposes."""
    from textual.binding import Binding
    from textual.widgets import Footer

    from chatui.textual_compat.testing import render_screen
    from chatui.widgets.footer import ChatFooter

    class WithFooter(App[None]):
        BINDINGS = [Binding("f5", "stop", "Stop"), Binding("f6", "clear", "Clear"),
                    Binding("f7", "more", "More")]
        armed = True
        more = True

        def compose(self) -> ComposeResult:
            yield ChatFooter()

        def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
            if action == "stop":
                return True if self.armed else None  # None: shown greyed out
            if action == "more":
                return self.more  # False: not shown
            return True

    def keys(app: App) -> list[object]:
        return list(app.query("FooterKey"))

    def footer_line(app: App) -> str:
        strip = render_screen(app)[-1]
        return "".join(f"{seg.text}|{seg.style}" for seg in strip)

    app = WithFooter()
    async with app.run_test(size=(60, 3)) as pilot:
        await pilot.pause()
        before = keys(app)
        assert [k.key for k in before][:3] == ["f5", "f6", "f7"]
        for armed in (False, True, False):
            app.armed = armed
            app.refresh_bindings()
            await pilot.pause()
            await pilot.pause()
            now = keys(app)
            assert now == before  # the same keys: nothing mounted anew
            assert now[0].has_class("-disabled") is (not armed)
            drawn = footer_line(app)
            footer = app.query_one(Footer)
            footer._shown = None  # the reference: the same bindings composed anew
            footer.call_later(footer.recompose)
            await pilot.pause()
            await pilot.pause()
            assert keys(app) != before
            assert footer_line(app) == drawn
            before = keys(app)
        app.more = False  # a binding that goes: composed anew
        app.refresh_bindings()
        await pilot.pause()
        await pilot.pause()
        assert [k.key for k in keys(app)][:3] == ["f5", "f6", "ctrl+p"]


async def test_no_key_is_shown_in_part(tmp_path, monkeypatch):
    """Textual's footer scrolls the keys that do not fit out of view mid-word ("f2 C" for
    "f2 Copy" at 100 cells, in front of the palette's key); ours hides them whole, and shows
    them again when the terminal is wider."""
    monkeypatch.setenv("CHATUI_CONFIG_DIR", str(tmp_path / "config"))
    monkeypatch.setenv("CHATUI_DATA_DIR", str(tmp_path / "data"))
    from chatui.textual_compat.testing import render_screen
    from test_app import loaded, make_app, send

    def shown(app) -> list[str]:
        """The footer's keys as drawn left of the palette's key; each must be whole."""
        line = render_screen(app)[-1].text
        left, bar, right = line.partition("▏")
        assert bar and "^p palette" in right
        keys = [key for key in app.screen.query("FooterKey")
                if not key.has_class("-command-palette") and key.display]
        texts = [" ".join(key.render().plain.split()) for key in keys]
        assert " ".join(left.split()) == " ".join(texts)  # nothing cut, nothing more
        return texts

    app = make_app()
    async with app.run_test(size=(100, 30)) as pilot:
        await loaded(pilot, app)
        await pilot.pause(0.3)
        at_100 = shown(app)
        assert at_100[-1] == "^o Continue"
        await pilot.resize_terminal(140, 30)
        await pilot.pause(0.3)
        at_140 = shown(app)
        assert len(at_140) > len(at_100) and "f2 Copy" in at_140
        await pilot.resize_terminal(60, 30)
        await pilot.pause(0.3)
        assert 2 <= len(shown(app)) < len(at_100)
        await send(pilot, app, "/compare temperature=0 | temperature=1")
        await send(pilot, app, "hello")  # "f6 Pick" comes first: the footer composed anew
        await pilot.pause(0.3)
        assert shown(app)[0] == "f6 Pick"
        await pilot.resize_terminal(100, 30)
        await pilot.pause(0.3)
        await send(pilot, app, "/compare off")
        for _ in range(2):  # the token view's keys, then the chat's again: composed anew
            await pilot.press("ctrl+t")
            await pilot.pause(0.5)
            shown(app)
