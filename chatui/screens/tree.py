"""The tree view (F5, ``/tree``): the whole conversation as a tree of branches (issue 18).

A conversation hundreds of messages deep is as deep a tree, so a line per message would be
unreadable: each line is a *branch*, a run of messages that follows a fork (or starts the
conversation) up to the next fork, with its first words, the mean logprob of its first reply
and its length. The branches the conversation goes on with are marked ``●``. Enter opens the
branch under the cursor (its last message and every choice above it become the path); Esc
closes. The screen only reads the conversation: it returns the chosen node's id and the chat
screen does the choosing.
"""

from __future__ import annotations

from dataclasses import dataclass

from rich.cells import cell_len, set_cell_size
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Static, Tree

from ..conversation import Conversation, Entry


@dataclass(frozen=True)
class Branch:
    """A run of messages between forks."""

    entries: tuple[Entry, ...]

    @property
    def first(self) -> Entry:
        return self.entries[0]

    @property
    def last(self) -> Entry:
        return self.entries[-1]


def branch_from(entry: Entry) -> Branch:
    """The run of messages starting at ``entry`` up to the next fork (a message with several
    children) or the end."""
    run = [entry]
    while len(run[-1].children) == 1:
        run.append(run[-1].children[0])
    return Branch(tuple(run))


def shared_words(entries: list[Entry]) -> int:
    """How many words the texts of ``entries`` (siblings) all start with: 0 for one entry."""
    if len(entries) < 2:
        return 0
    texts = [e.text.split() for e in entries]
    n = 0
    for words in zip(*texts):
        if any(w != words[0] for w in words):
            break
        n += 1
    return n


WORDS_CELLS = 36
"""The most columns a branch's first words take, so that its statistics stay on its line."""


def branch_label(branch: Branch, on_path: bool, shared: int = 0) -> str:
    """``● assistant: first words… · mean lp -0.42 · 37 tok · 4 messages``; ``shared``: how
    many words it starts with that its siblings start with too (a fork late in a reply, or a
    retry that began the same way): its words are then shown from the word before they part,
    ``…the keeper named Olf, who…``, so siblings can be told apart."""
    first = branch.first
    all_words = first.text.split()
    # from the word before they part; from the start when nothing of it comes after the part
    # it shares (siblings with the same text, as a retry of a deterministic reply gives)
    start = shared - 1 if 0 < shared < len(all_words) else 0
    words = " ".join(all_words[start:start + 6]) or "(empty)"
    more = len(all_words) > start + 6
    if cell_len(words) > WORDS_CELLS:  # long "words" (a URL, emoji, code): the statistics
        words = set_cell_size(words, WORDS_CELLS - 1).rstrip()  # after them were cut off
        space = words.rfind(" ")
        if space > len(words) // 2:  # at a word's end where there is one near
            words = words[:space]
        more = True
    if start:
        words = "…" + words
    if more:
        words += "…"
    who = "you" if first.role == "user" else "assistant"
    parts = [f"{'●' if on_path else '○'} {who}: {words}"]
    reply = next((e.reply for e in branch.entries if e.reply is not None), None)
    if reply is not None:
        mean = reply.mean_logprob
        parts.append("mean lp " + (f"{mean:.2f}" if mean is not None else "n/a"))
        parts.append(f"{reply.token_count} tok")
    n = len(branch.entries)
    parts.append(f"{n} message{'s' if n != 1 else ''}")
    return " · ".join(parts)


class TreeScreen(ModalScreen[str | None]):
    """The conversation's branches as a tree; returns the node id to open, or None."""

    DEFAULT_CSS = """
    TreeScreen { align: center middle; }
    TreeScreen > Vertical { width: 100; max-width: 100%; height: 80%;
        border: round $primary; background: $surface; padding: 0 1; }
    TreeScreen .tree-help { color: $text-muted; height: 1; }
    TreeScreen Tree { height: 1fr; }
    """

    BINDINGS = [Binding("escape,f5", "close", "Close", id="tree.close", priority=True)]

    def __init__(self, conversation: Conversation) -> None:
        super().__init__()
        self.conversation = conversation

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Static("Branches of this conversation (● the one shown). Enter opens a "
                         "branch, Esc closes.", classes="tree-help", markup=False)
            tree: Tree[str] = Tree(Text("conversation"), id="tree")
            tree.auto_expand = False
            tree.show_root = False
            yield tree

    def on_mount(self) -> None:
        tree = self.query_one(Tree)
        path = {id(e) for e in self.conversation.entries}
        cursor = None
        tops = list(self.conversation.tops)
        stack = [(tree.root, e, shared_words(tops)) for e in reversed(tops)]
        while stack:
            parent, entry, shared = stack.pop()
            branch = branch_from(entry)
            on_path = all(id(e) in path for e in branch.entries)
            node = parent.add(Text(branch_label(branch, on_path, shared)),
                              data=branch.last.node, expand=True,
                              allow_expand=bool(branch.last.children))
            if on_path:
                cursor = node
            kids = list(branch.last.children)
            shared_kids = shared_words(kids)
            stack.extend((node, c, shared_kids) for c in reversed(kids))
        tree.root.expand()
        tree.focus()
        if cursor is not None:  # on the branch shown (once the lines exist)
            self.call_after_refresh(tree.move_cursor, cursor)

    def on_tree_node_selected(self, event: Tree.NodeSelected[str]) -> None:
        event.stop()
        if event.node.data is not None:
            self.dismiss(event.node.data)

    def action_close(self) -> None:
        self.dismiss(None)
