"""``/score`` in the chat (issue 17, part 2): a message's tokens in the token view coloured by
their own probability, with its perplexity and least likely tokens, over the scripted backend."""

from __future__ import annotations

from test_app import SIZE, make_app, notices, send

from chatui.widgets.scored import ScoredMessage


async def run(pilot, app, text):
    """Submit ``text`` and wait for a scored message or an error more than before."""
    before = len(app.chat.query(ScoredMessage)) + len(notices(app, "error"))
    app.chat.prompt.text = text
    await pilot.press("enter")
    for _ in range(100):
        await pilot.pause(0.02)
        if len(app.chat.query(ScoredMessage)) + len(notices(app, "error")) > before:
            break
    await pilot.pause(0.1)


def scored_as(app, text: str, label: str) -> ScoredMessage:
    """The one scored message shown, checked to hold ``text`` (as the backend was asked to
    score it) under a header naming ``label``."""
    [scored] = app.chat.query(ScoredMessage)
    assert "".join(t.text for t in scored.tokens) == text
    assert app.holder["backend"].scored[-1].text == text
    assert label in str(scored.query_one(".score-header").render())
    return scored


async def test_score_shows_the_last_user_message_in_the_token_view():
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await send(pilot, app, "the quick brown fox jumps")
        await run(pilot, app, "/score")
        backend = app.holder["backend"]
        assert [r.text for r in backend.scored] == ["the quick brown fox jumps"]
        [scored] = app.chat.query(ScoredMessage)
        tokens = scored.tokens
        assert "".join(t.text for t in tokens) == "the quick brown fox jumps"
        header = str(scored.query_one(".score-header").render())
        lps = [t.logprob for t in tokens if t.logprob is not None]
        import math
        assert f"perplexity {math.exp(-sum(lps) / len(lps)):.4g} over 4 of 5 tokens" in header
        least = min(tokens[1:], key=lambda t: t.logprob)
        assert f"least likely: {least.text!r}" in header
        # the token view has the cursor on the least likely token, the inspector shows it
        tv = scored.token_view
        assert app.chat.token_mode and app.chat.inspector.display and app.focused is tv
        assert tv.units[tv.cursor].start == least.index
        detail = str(app.chat.inspector.query_one(".detail").render())
        assert f"{least.prob:.2%}" in detail and "alternatives" in detail
        # nothing continues a scored message: its alternatives offer no "continue"
        # (they did, and a digit then said it could not; seen in tmux), a reply's do
        assert "continue" not in detail
        from chatui.widgets.inspector import describe_tokens

        assert "(digit or click: continue)" in str(describe_tokens([least], 0, 1))
        await pilot.press("home")
        await pilot.pause(0.1)
        detail = str(app.chat.inspector.query_one(".detail").render())
        assert "token 1 of" in detail


async def test_score_by_number_scores_a_reply_and_refuses_bad_numbers():
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await run(pilot, app, "/score")
        assert "no message to score" in str(notices(app, "error")[-1].render())
        await send(pilot, app, "hello")
        await run(pilot, app, "/score 9")
        assert "from 1 to 2, 'system' or a text; there is no message 9" in str(
            notices(app, "error")[-1].render())
        await run(pilot, app, "/score 2")
        [scored] = app.chat.query(ScoredMessage)
        reply = app.chat.state.conversation.entries[1].text
        assert "".join(t.text for t in scored.tokens) == reply
        assert "message 2 (assistant)" in str(scored.query_one(".score-header").render())


async def test_score_text_scores_the_text_typed_after_it():
    """``/score TEXT`` scores the text itself, as ``chatui score -p TEXT`` does (it said "There
    is no message to score", or asked for a message number; seen in tmux), with or without a
    conversation; quoted, its leading space is kept."""
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await run(pilot, app, "/score The cat sat on the mat.")
        scored_as(app, "The cat sat on the mat.", "the text given")
        assert not notices(app, "error")
        await pilot.press("escape")  # (from the scored message's tokens to the prompt)
        await send(pilot, app, "hello")
        await run(pilot, app, '/score " a leading space"')
        assert len(app.chat.query(ScoredMessage)) == 2
        assert app.holder["backend"].scored[-1].text == " a leading space"
        assert [e.text for e in app.chat.state.conversation.entries][0] == "hello"


async def test_score_system_scores_the_system_prompt():
    app = make_app(system_prompt="You are a terse assistant.")
    async with app.run_test(size=SIZE) as pilot:
        await run(pilot, app, "/score system")
        scored_as(app, "You are a terse assistant.", "the system prompt")
        # its alternatives are the model's, but there is no reply to continue: one sentence
        await pilot.press("1")
        await pilot.pause(0.1)
        assert "not of a scored message" in str(notices(app, "error")[-1].render())



async def test_score_system_without_a_system_prompt_says_so():
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await run(pilot, app, "/score system")
        assert "no system prompt to score" in str(notices(app, "error")[-1].render())
        assert not app.chat.query(ScoredMessage)


async def test_score_shows_its_message_at_the_end_of_a_long_conversation():
    """The scored message is on screen when /score ends, however long the conversation above
    it and however tall its replies grow in the token view /score switches on."""
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        for i in range(6):
            await send(pilot, app, f"message number {i} " + "with many words " * 30)
        await run(pilot, app, "/score")
        await pilot.pause(0.3)
        [scored] = app.chat.query(ScoredMessage)
        log = app.chat.log_view
        assert log.scroll_y >= log.max_scroll_y - 1
        assert scored.region.height and log.region.contains_region(scored.region), (
            scored.region, log.region)


def test_the_score_header_wraps_between_tokens_never_inside_one():
    """``least likely: ' capital' 0.87%, ' is' 1.70%``: the header broke at the space inside
    a quoted token (``, '`` ending a line, ``is' 1.70%`` starting the next, seen in tmux);
    it now breaks only after a separator, at any width."""
    from chatui.widgets.parts_line import joined, pack
    from chatui.widgets.scored import score_summary, score_summary_pieces
    from inference.types import Token

    tokens = [Token(0, 1, "What", None, None), Token(1, 2, " is", -4.07, 0.0),
              Token(2, 3, " the", -0.5, 0.0), Token(3, 4, " capital", -4.74, 0.0),
              Token(4, 5, " of", -0.2, 0.0), Token(5, 6, " France", -2.0, 0.0)]
    least = sorted(tokens[1:], key=lambda t: t.logprob)[:3]
    pieces = score_summary_pieces("message 1 (user)", tokens, 7.499, 5, least)
    line = score_summary("message 1 (user)", tokens, 7.499, 5, least)
    assert line == joined(pieces) == ("scored message 1 (user): perplexity 7.499 over 5 of 6 "
                                      "tokens · least likely: ' capital' 0.87%, ' is' 1.71%, "
                                      "' France' 13.53%")
    for width in range(20, 110):
        lines = pack(pieces, width).split("\n")
        assert all(any(text in row for row in lines) for text, _ in pieces
                   if len(text) <= width), (width, lines)  # each part whole on a line
        for text in lines:
            assert text.rstrip(",·").rstrip().endswith(("%", "tokens")), (width, lines)


async def test_typing_after_score_goes_to_the_prompt():
    """The scored message's token view has the focus after ``/score``; what is typed then (a
    next command, a message) goes to the prompt as from a reply's token view: it was
    dropped, and its letters ran the view's keys (``r`` the raw view; seen in tmux). So does
    typing in a comparison's column."""
    from textual import events

    from chatui.textual_compat.testing import deliver

    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await send(pilot, app, "the quick brown fox jumps")
        await run(pilot, app, "/score")
        assert app.focused is app.chat.query_one(ScoredMessage).token_view
        for ch in "/score words":
            deliver(app, events.Key("space" if ch == " " else ch, ch))
        await pilot.pause(0.1)
        assert app.chat.prompt.text == "/score words" and not app.chat.raw
        assert app.focused is app.chat.prompt
        app.chat.prompt.text = ""
        await pilot.press("ctrl+t")  # (token view off)
        await send(pilot, app, "/compare temp=0 | temp=1")
        await send(pilot, app, "hello there")
        assert app.chat.conversation.entries[-1].is_comparison
        await pilot.press("ctrl+t")
        await pilot.pause(0.1)
        from chatui.widgets.token_view import TokenView

        assert isinstance(app.focused, TokenView)
        for ch in "/help":
            deliver(app, events.Key(ch, ch))
        await pilot.pause(0.1)
        assert app.chat.prompt.text == "/help"
