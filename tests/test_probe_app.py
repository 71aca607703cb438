"""``/probe TEXT`` and what the sampler did, in the chat: the request carries the reply's
prompt and its tokens before the token view's cursor; the notice gives the first token's
probability and rank and the whole text's; the inspector shows the post-sampler column."""

from __future__ import annotations

import math

from test_app import SIZE, make_app, notices, replies, send

from chatui.chat_commands import describe_probe, probe_text
from chatui.widgets.inspector import describe_tokens
from inference.types import Alternative, Message, SamplerCut, Scored, Token


async def run(pilot, app, text):
    app.chat.prompt.text = text
    await pilot.press("enter")
    for _ in range(100):
        await pilot.pause(0.02)
        if [n for n in notices(app) if "/probe" in str(n.render())] or notices(app, "error"):
            break
    await pilot.pause(0.05)


async def test_probe_asks_at_the_cursor_and_says_probability_and_rank():
    app = make_app(lambda r, row: "one two three four five")
    async with app.run_test(size=SIZE) as pilot:
        await send(pilot, app, "count")
        await run(pilot, app, '/probe " six"')
        assert "Put the token view's cursor" in str(notices(app, "error")[-1].render())
        await pilot.press("ctrl+t")
        await pilot.pause(0.1)
        await pilot.press("home", "right", "right")
        await pilot.pause(0.1)
        view = replies(app)[0]
        position = view.token_view.units[2].start
        await pilot.press("escape")
        await run(pilot, app, '/probe " six seven"')
        backend = app.holder["backend"]
        req = backend.scored[-1]
        assert req.text == " six seven"
        assert req.context == (Message("user", "count"),)
        assert req.prefix.text == view.reply.tokens.text(0, position)
        text = str(notices(app)[-1].render())
        assert f"at token {position + 1} of the reply" in text
        assert "its first token" in text and "rank" in text and "the whole text" in text


def test_probe_text_keeps_quoted_spaces_and_the_notice_names_every_token():
    assert probe_text('" Paris"') == " Paris" and probe_text("Paris") == "Paris"
    toks = (Token(0, 5, " Par", math.log(0.25), None), Token(1, 6, "is", math.log(0.5), None))
    line = describe_probe(" Paris", "at token 3 of the reply", Scored(toks, (4, 1)))
    assert "' Par' 25.00% (rank 4)" in line
    assert "the whole text, 2 tokens: 12.50% (' Par' 25.00% · 'is' 50.00%)" in line


def test_inspector_shows_the_post_sampler_probability_the_cut_and_the_nucleus():
    alts = (Alternative(5, "a", math.log(0.5)), Alternative(6, "b", math.log(0.3)),
            Alternative(7, "c", math.log(0.1)))
    tok = Token(0, 5, "a", math.log(0.5), 1.0, alts,
                sampler=SamplerCut(0.625, 2, (0.625, 0.375, 0.0), ("", "", "top-p")))
    text = str(describe_tokens([tok], 0, 1))
    assert "sampled      62.50%   nucleus 2 tokens" in text
    lines = text.splitlines()
    assert any("raw sampled" in line for line in lines)
    assert any(line.startswith("1 ") and "50.0%   62.5%" in line for line in lines)
    assert any(line.startswith("3 ") and "10.0%   top-p" in line for line in lines)
    plain = str(describe_tokens([Token(0, 5, "a", math.log(0.5), 1.0, alts)], 0, 1))
    assert "sampled" not in plain and "nucleus" not in plain
