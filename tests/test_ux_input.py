"""Issue 14, section 2: input is lossless at every transition (pilot side; the tmux test
covers the start), and a box of any size can be emptied with one key."""

from __future__ import annotations

from textual import events

from chatui.textual_compat.testing import deliver
from test_app import SIZE, config_dir, loaded, make_app, send, settle  # noqa: F401


def type_now(app, text: str) -> None:
    """Keys as the terminal driver delivers them, without waiting for the app."""
    for ch in text:
        deliver(app, events.Key(ch, ch))


async def test_ctrl_l_empties_a_huge_paste_and_ctrl_z_brings_it_back():
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot, app)
        big = ("0123456789abcdef" * 64 + "\n") * 60  # about 60 KB
        app.chat.prompt.text = big
        await pilot.pause()
        assert "prompt.clear" in {b.binding.id for b in app.active_bindings.values()}
        assert app.chat.prompt.check_action("clear_all", ()) is True  # shown in the footer
        await pilot.press("ctrl+l")
        assert app.chat.prompt.text == ""
        await pilot.press("ctrl+z")
        assert app.chat.prompt.text == big
        await pilot.press("ctrl+l")
        await pilot.pause()
        assert app.chat.prompt.check_action("clear_all", ()) is None  # hidden: nothing to clear


async def test_help_lists_the_clear_key():
    from chatui.screens.help import help_text

    assert "Ctrl+L" in help_text().plain


async def test_keys_while_nothing_has_the_focus_reach_the_prompt():
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot, app)
        app.chat.set_focus(None)  # as during a focus change (focus() is deferred)
        type_now(app, "kept")
        await pilot.pause()
        assert app.chat.prompt.text == "kept"


async def test_keys_typed_while_the_conversation_has_the_focus_reach_the_prompt():
    """Tab from the prompt gives the conversation the focus (its arrows and pages scroll it);
    what is typed then goes to the prompt, in order, and Enter sends it: the characters were
    dropped (seen in tmux). Its own keys still scroll it; a key bound and enabled is left
    to its binding."""
    from chatui.widgets.settled import ConversationLog

    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        for i in range(4):
            await send(pilot, app, f"message {i} " + "with words " * 40)
        await pilot.press("tab")
        await pilot.pause()
        log = app.chat.query_one(ConversationLog)
        assert app.focused is log
        bottom = log.scroll_y
        await pilot.press("pageup")
        await pilot.pause(0.2)
        assert app.focused is log and log.scroll_y < bottom  # (its own key: it scrolled)
        type_now(app, "typed there")
        await pilot.pause(0.1)
        assert app.chat.prompt.text == "typed there" and app.focused is app.chat.prompt
        await pilot.press("enter")
        await settle(pilot, app)
        assert app.chat.conversation.entries[-2].text == "typed there"
        await pilot.press("tab")
        await pilot.pause()
        await pilot.press("r")  # (bound to the raw token view, which is off here: typed)
        await pilot.pause()
        assert app.chat.prompt.text == "r" and not app.chat.raw


async def test_keys_typed_as_a_modal_closes_reach_the_prompt():
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot, app)
        await pilot.press("f1")
        await pilot.pause()
        deliver(app, events.Key("escape", None))
        type_now(app, "after help")
        await pilot.pause(0.1)
        assert app.chat.prompt.text == "after help"


async def test_keys_typed_as_a_reply_ends_reach_the_prompt():
    app = make_app(delay_s=0.01)
    async with app.run_test(size=SIZE) as pilot:
        await send(pilot, app, "hello", wait=False)
        type_now(app, "next one")
        await settle(pilot, app)
        type_now(app, "!")
        await pilot.pause()
        assert app.chat.prompt.text == "next one!"


async def test_keys_held_before_the_chat_screen_are_replayed_in_order():
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot, app)
        app._held = []  # as before the chat screen was mounted
        type_now(app, "early")
        deliver(app, events.Key("ctrl+j", None))  # Enter, typed while the tty was in line mode
        await pilot.pause()
        assert app.chat.prompt.text == ""
        from chatui.messages import InputReady

        app.post_message(InputReady())
        type_now(app, "late")
        await settle(pilot, app)
        await pilot.pause(0.1)
        assert app.chat.conversation.entries[0].text == "early"
        assert app.chat.prompt.text == "late"


async def test_keys_typed_as_the_compare_screen_closes_reach_the_prompt():
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot, app)
        await send(pilot, app, "/compare")
        await pilot.pause(0.1)
        deliver(app, events.Key("escape", None))
        type_now(app, "after compare")
        await pilot.pause(0.1)
        assert app.chat.prompt.text == "after compare"


async def test_keys_typed_as_the_compare_screen_opens_reach_its_first_column():
    """``/compare``, Enter and a column typed at once: the column lands in the first field
    (replacing what it held, as a click there and typing would); it went to the presets'
    list, which had the focus until the screen's ``on_mount`` moved it, and was lost (seen
    in tmux)."""
    from chatui.screens.compare import CompareScreen

    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot, app)
        app.chat.prompt.text = "/compare"
        deliver(app, events.Key("enter", "\r"))
        type_now(app, "top_k=5")
        for _ in range(50):
            await pilot.pause(0.02)
            screen = app.screen
            if isinstance(screen, CompareScreen) and screen.is_mounted \
                    and screen.column_input(0).value == "top_k=5":
                break
        assert isinstance(app.screen, CompareScreen)
        assert app.screen.column_input(0).value == "top_k=5"
        assert app.chat.prompt.text == ""
        await pilot.press("escape")
        await pilot.pause(0.1)
        # opened otherwise (not sent from the box): the box's draft stays the chat's, and keys
        # that come before the screen is up reach its first column all the same
        app.chat.prompt.text = "a draft"
        await app.chat.action_command("/compare")
        type_now(app, "top_p=0.5")
        await pilot.pause(0.3)
        assert isinstance(app.screen, CompareScreen)
        assert app.screen.column_input(0).value == "top_p=0.5"
        assert app.chat.prompt.text == "a draft"


async def test_edit_keeps_a_draft_that_was_in_the_box():
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await send(pilot, app, "first prompt")
        app.chat.prompt.text = "a draft I was writing"
        await pilot.press("ctrl+g")
        await pilot.pause(0.1)
        assert app.chat.prompt.text == "first prompt"
        app.chat.prompt.move_cursor((0, 0))
        await pilot.press("up")
        assert app.chat.prompt.text == "a draft I was writing"


async def test_page_keys_in_the_prompt_page_the_conversation():
    """PageUp/PageDown typed in a one-line prompt page the conversation (found using the app in
    tmux: they moved nothing); in a prompt taller than its box they stay the box's own."""
    from test_app import SIZE, make_app, send

    app = make_app(lambda r, row: "line\n\n" * 40)
    async with app.run_test(size=SIZE) as pilot:
        for text in ("one", "two"):
            await send(pilot, app, text)
        log = app.chat.log_view
        await pilot.pause(0.3)
        assert log.max_scroll_y > 0 and log.scroll_y == log.max_scroll_y
        app.chat.prompt.focus()
        await pilot.press("pageup")
        await pilot.pause(0.3)
        assert log.scroll_y < log.max_scroll_y
        await pilot.press("pagedown", "pagedown")
        await pilot.pause(0.3)
        assert log.scroll_y == log.max_scroll_y
        app.chat.prompt.text = "\n".join(f"l{i}" for i in range(40))
        await pilot.pause(0.2)
        at = log.scroll_y
        await pilot.press("pageup")
        await pilot.pause(0.3)
        assert log.scroll_y == at  # the box paged its own text


def test_held_keys_wait_for_a_quiet_terminal():
    """``early_input.QuietWatch``: the held keys go to the prompt once nothing typed is left
    unread for ``QUIET_S`` (bytes still unread start the wait again), or after ``MAX_S``
    whatever the terminal says."""
    from chatui import early_input as e

    watch = e.QuietWatch()
    assert not watch.settled(0.0, unread=0)
    assert not watch.settled(e.QUIET_S / 2, unread=5)  # the input thread has not read them
    assert not watch.settled(e.QUIET_S, unread=0)  # quiet only from now
    assert watch.settled(e.QUIET_S * 2, unread=0)
    stuck = e.QuietWatch()
    assert not stuck.settled(0.0, unread=3)
    assert not stuck.settled(e.MAX_S / 2, unread=3)
    assert stuck.settled(e.MAX_S, unread=3)
    assert e.unread_bytes() >= 0  # (pytest's stdin: not a terminal, or nothing typed)


async def test_a_newline_and_a_clear_typed_in_a_burst_land_where_they_were_typed():
    """Ctrl+J (or Shift/Alt+Enter) and Ctrl+L act in the order the keys came: as bindings
    they ran once the key had bubbled up to the app, after the keys behind them ("abc",
    Ctrl+J, "def" in one burst gave "abcdef" and then the line break; seen in tmux)."""
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot, app)
        for newline in ("ctrl+j", "shift+enter", "alt+enter"):
            app.chat.prompt.text = ""
            await pilot.pause()
            type_now(app, "abc")
            deliver(app, events.Key(newline, None))
            type_now(app, "def")
            await pilot.pause(0.1)
            assert app.chat.prompt.text == "abc\ndef", newline
        type_now(app, "gone")
        deliver(app, events.Key("ctrl+l", None))
        type_now(app, "kept")
        await pilot.pause(0.1)
        assert app.chat.prompt.text == "kept"


async def test_a_tab_typed_in_a_burst_completes_what_was_typed_before_it():
    """"/ti", Tab, "Plans" typed at once give "/title Plans": Tab, a priority binding, ran as
    its key arrived, completed the still empty box and moved the focus (seen in tmux:
    "/tiPlans", an unknown command)."""
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot, app)
        type_now(app, "/ti")
        deliver(app, events.Key("tab", "\t"))
        type_now(app, "Plans")
        await pilot.pause(0.2)
        assert app.chat.prompt.text == "/title Plans"
        assert app.focused is app.chat.prompt


async def test_keys_typed_right_after_ctrl_g_extend_the_edited_prompt():
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await send(pilot, app, "first")
        deliver(app, events.Key("ctrl+g", None))
        type_now(app, " more")
        await pilot.pause(0.2)
        assert app.chat.prompt.text == "first more"  # (" more" went aside as a draft)
        assert app.chat.state.editing is not None


async def test_keys_typed_right_after_tree_and_enter_act_in_the_tree():
    """``/tree``, Enter, Up and Enter typed at once open the branch above the one shown: the
    tree was not up when Up and Enter came, so the message box took them (its history, an
    empty send) and the tree never saw them (seen in tmux). The app holds what comes after
    an Enter in the box until what it sent is taken up (``ChatApp.on_submit_settled``)."""
    counter = iter(range(100))
    app = make_app(lambda request, row: f"reply-{next(counter)} in words")
    async with app.run_test(size=SIZE) as pilot:
        await send(pilot, app, "first question")
        await send(pilot, app, "/retry")
        assert app.chat.conversation.entries[-1].text.startswith("reply-1")
        app.chat.prompt.text = "/tree"
        deliver(app, events.Key("enter", "\r"))
        deliver(app, events.Key("up", None))
        deliver(app, events.Key("enter", "\r"))
        await shown_reply(pilot, app, "reply-0")
        assert app.chat.prompt.text == "" and app.chat.prompt.prompt_history[-1] == "/tree"
        type_now(app, "then this")  # typing goes on in the box
        await pilot.pause(0.1)
        assert app.chat.prompt.text == "then this"
        # F5 (a key that opens the tree) and the keys after it, as fast
        deliver(app, events.Key("f5", None))
        deliver(app, events.Key("down", None))
        deliver(app, events.Key("enter", "\r"))
        type_now(app, " and more")  # (after the tree's Enter: the chat's again)
        await shown_reply(pilot, app, "reply-1")
        await pilot.pause(0.1)
        assert app.chat.prompt.text == "then this and more"


async def shown_reply(pilot, app, first_word: str) -> None:
    """Wait until the chat is back on top showing the reply that starts with ``first_word``."""
    for _ in range(500):
        await pilot.pause(0.02)
        if app.screen is app.chat and app.chat.conversation.entries[-1].text.startswith(
                first_word):
            break
    assert app.screen is app.chat
    assert [e.text.split()[0] for e in app.chat.conversation.entries] == [
        "first", first_word]


async def test_keys_after_enter_are_held_only_until_the_send_is_taken_up():
    """A message sent and the next one typed at once: the next one is in the box, in order,
    and an Enter in an empty box holds nothing (the keys after it are typed at once)."""
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot, app)
        type_now(app, "one")
        deliver(app, events.Key("enter", "\r"))
        type_now(app, "two")
        await settle(pilot, app)
        await pilot.pause(0.05)
        assert app.chat.conversation.entries[0].text == "one"
        assert app.chat.prompt.text == "two"
        app.chat.prompt.text = ""
        deliver(app, events.Key("enter", "\r"))
        type_now(app, "x")
        await pilot.pause(0.05)
        assert app.chat.prompt.text == "x" and app._held_after is None


async def test_keys_typed_right_after_ctrl_f_or_find_reach_the_search_box():
    """Ctrl+F (a key) or ``/find`` and Enter (a command), then the words at once: they are
    the search's, not the message box's (the search screen was not up yet)."""
    from textual.widgets import Input

    from chatui.screens.history import HistoryScreen

    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot, app)
        for opening in ([events.Key("ctrl+f", None)], "/find"):
            if isinstance(opening, str):
                app.chat.prompt.text = opening
                opening = [events.Key("enter", "\r")]
            for key in opening:
                deliver(app, key)
            type_now(app, "pirate")
            for _ in range(500):
                await pilot.pause(0.02)
                if isinstance(app.screen, HistoryScreen) and \
                        app.screen.query_one(Input).value == "pirate":
                    break
            assert isinstance(app.screen, HistoryScreen)
            assert app.screen.query_one(Input).value == "pirate"
            assert app.chat.prompt.text == ""
            await pilot.press("escape")
            await pilot.pause(0.1)


async def test_keys_typed_after_a_columns_enter_reach_the_prompt():
    """``/compare``, a column, Enter and the message typed at once: the column is armed whole
    (Enter acts after the keys typed before it) and the message is the chat's (it went to the
    compare screen, closing a moment later, and was lost)."""
    from chatui.screens.compare import CompareScreen

    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot, app)
        for closing in ("enter", "ctrl+j"):
            app.chat.prompt.text = "/compare"
            deliver(app, events.Key("enter", "\r"))
            type_now(app, "top_k=5")
            deliver(app, events.Key(closing, "\r" if closing == "enter" else None))
            type_now(app, "hello")
            for _ in range(500):
                await pilot.pause(0.02)
                if not isinstance(app.screen, CompareScreen) and app.chat.prompt.text:
                    break
            assert not isinstance(app.screen, CompareScreen)
            assert app.chat.prompt.text == "hello", closing
            assert app.chat.state.armed is not None
            assert app.chat.state.armed.specs[0] == "top_k=5"
            app.chat.prompt.text = ""
            await send(pilot, app, "/compare off")
