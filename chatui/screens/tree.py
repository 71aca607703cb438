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
from rich.style import Style
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Static, Tree
from textual.widgets.tree import TreeNode

from ..conversation import Conversation, Entry
from .once import DismissOnce


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


def parting_words(entries: list[Entry]) -> list[int]:
    """For each of ``entries`` (siblings), how many words it shares with the sibling it parts
    from last (0 for a lone entry): its label starts at the word before they part, so two
    branches alike for a long way are told apart where they differ, not where they all do (a
    fan-out's first branch and the reply it came from, both the reply's own token there, read
    "…fox, which is a member of the family…" twice; seen in tmux). A sibling with another's
    very text parts where it leaves the rest."""
    texts = [e.text.split() for e in entries]

    def common(a: list[str], b: list[str]) -> int:
        return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))

    out = []
    for i, mine in enumerate(texts):
        others = [common(mine, t) for j, t in enumerate(texts) if j != i and t != mine]
        alike = any(j != i and t == mine for j, t in enumerate(texts))
        out.append(max(others) if others else len(mine) if alike else 0)
    return out


WORDS_CELLS = 36
"""The most columns a branch's first words take where the line's width is not known, so that
its statistics stay on its line."""

MIN_WORDS_CELLS = 12
"""The fewest columns the first words get before statistics are left out to make room (a deep
branch in a narrow terminal: the tree view cut such lines at its edge)."""


def branch_label(branch: Branch, on_path: bool, shared: int = 0,
                 width: int | None = None) -> str:
    """``● assistant: first words… · mean lp -0.42 · 37 tok · 4 messages``; ``shared``: how
    many words it starts with that its siblings start with too (a fork late in a reply, or a
    retry that began the same way): its words are then shown from the word before they part,
    ``…the keeper named Olf, who…``, so siblings can be told apart.

    ``width``: the columns the line has. The first words then take what the statistics leave
    (as many words as fit, not six), and where even ``MIN_WORDS_CELLS`` would not fit, the
    statistics go from the last (messages, tokens, mean logprob) until they do; the label is
    never wider than ``width``. Without it, six words of at most ``WORDS_CELLS`` columns."""
    first = branch.first
    all_words = first.text.split()
    # from the word before they part; from the start when nothing of it comes after the part
    # it shares (siblings with the same text, as a retry of a deterministic reply gives)
    start = shared - 1 if 0 < shared < len(all_words) else 0
    who = "you" if first.role == "user" else "assistant"
    head = f"{'●' if on_path else '○'} {who}: "
    stats = []
    reply = next((e.reply for e in branch.entries if e.reply is not None), None)
    if reply is not None:
        mean = reply.mean_logprob
        stats.append("mean lp " + (f"{mean:.2f}" if mean is not None else "n/a"))
        stats.append(f"{reply.token_count} tok")
    n = len(branch.entries)
    stats.append(f"{n} message{'s' if n != 1 else ''}")
    if width is None:
        room, count = WORDS_CELLS, 6
    else:
        def tail_len() -> int:
            return sum(3 + cell_len(p) for p in stats)
        while stats and width - cell_len(head) - tail_len() < MIN_WORDS_CELLS:
            stats.pop()
        room = max(1, width - cell_len(head) - tail_len())
        count = min(len(all_words), room)  # (a word and its space take two cells or more)
    words = _first_words(all_words[start:], count, room, ellipsis_before=bool(start))
    label = " · ".join([head + words, *stats])
    return set_cell_size(label, width).rstrip() if width is not None else label


def _first_words(words: list[str], count: int, room: int, ellipsis_before: bool) -> str:
    """At most ``count`` of ``words`` in at most ``room`` columns, an ellipsis where some were
    left out: cut at a word's end where one is near, else mid-word (a URL, emoji, code)."""
    if not words:
        return "(empty)"
    budget = room - (1 if ellipsis_before else 0)
    text = " ".join(words[:count])
    more = len(words) > count
    if cell_len(text) > budget or (more and cell_len(text) + 1 > budget):
        cut = set_cell_size(text, max(1, budget - 1)).rstrip()
        space = cut.rfind(" ")
        if space > len(cut) // 2:  # at a word's end where there is one near
            cut = cut[:space]
        text, more = cut, True
    return ("…" if ellipsis_before else "") + text + ("…" if more else "")


@dataclass(frozen=True)
class BranchLine:
    """What a line of the tree view shows: a branch, whether the conversation goes on with it,
    and how many first words it shares with its siblings."""

    branch: Branch
    on_path: bool
    shared: int

    @property
    def node(self) -> str:
        """The node id Enter opens: the branch's last message."""
        return self.branch.last.node


TOGGLE = Style.from_meta({"toggle": True})
"""The meta a tree's click handler reads on an expand icon (as Textual's own ``render_label``
marks it)."""


class BranchTree(Tree[BranchLine]):
    """A tree whose lines are fitted to its width when drawn: a branch's first words take the
    room its depth and the statistics leave (a resize fits them again)."""

    def render_label(self, node: TreeNode[BranchLine], base_style: Style, style: Style) -> Text:
        line = node.data
        if line is None:
            return super().render_label(node, base_style, style)
        depth = 0
        parent = node.parent
        while parent is not None and parent is not self.root:
            depth += 1
            parent = parent.parent
        icon = cell_len(self.ICON_NODE) if node.allow_expand else 0
        width = self.scrollable_content_region.width - depth * self.guide_depth - icon
        label = Text(branch_label(line.branch, line.on_path, line.shared, width=max(width, 1)))
        label.stylize(style)
        if not node.allow_expand:
            return label
        icon_text = self.ICON_NODE_EXPANDED if node.is_expanded else self.ICON_NODE
        return Text.assemble((icon_text, base_style + TOGGLE), label)


class TreeScreen(DismissOnce, ModalScreen[str | None]):
    """The conversation's branches as a tree; returns the node id to open, or None."""

    DEFAULT_CSS = """
    TreeScreen { align: center middle; }
    TreeScreen > Vertical { width: 100%; max-width: 150; height: 80%;
        border: round $primary; background: $surface; padding: 0 1; }
    TreeScreen .tree-help { color: $text-muted; height: auto; }
    TreeScreen Tree { height: 1fr; }
    """

    BINDINGS = [Binding("escape,f5", "close", "Close", id="tree.close", priority=True),
                Binding("enter", "open", "Open", id="tree.open", priority=True),
                *[Binding(key, f"move('{action}')", show=False, priority=True)
                  for key, action in (("up", "cursor_up"), ("down", "cursor_down"),
                                      ("pageup", "page_up"), ("pagedown", "page_down"),
                                      ("home", "scroll_home"), ("end", "scroll_end"))]]
    """Enter closes the screen as its key arrives (a priority binding), as Esc does, so that
    the keys typed after it are the chat's (``ChatApp`` holds them until the chat is drawn):
    through the tree's own Enter the screen closed a message later, and they went to the
    tree. The keys that move the cursor are priority bindings too, so that they act in the
    order typed with Enter (a priority binding runs ahead of keys queued for the tree)."""

    def __init__(self, conversation: Conversation) -> None:
        super().__init__()
        self.conversation = conversation

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Static("Branches of this conversation (● the one shown). Enter opens a "
                         "branch, Esc closes.", classes="tree-help", markup=False)
            tree = BranchTree(Text("conversation"), id="tree")
            tree.auto_expand = False
            tree.show_root = False
            yield tree

    def on_mount(self) -> None:
        tree = self.query_one(Tree)
        path = {id(e) for e in self.conversation.entries}
        cursor = None
        tops = list(self.conversation.tops)
        stack = list(reversed([(tree.root, e, n) for e, n in zip(tops, parting_words(tops))]))
        while stack:
            parent, entry, shared = stack.pop()
            branch = branch_from(entry)
            on_path = all(id(e) in path for e in branch.entries)
            node = parent.add(Text(branch_label(branch, on_path, shared)),
                              data=BranchLine(branch, on_path, shared), expand=True,
                              allow_expand=bool(branch.last.children))
            if on_path:
                cursor = node
            kids = list(branch.last.children)
            stack.extend(reversed([(node, c, n) for c, n in zip(kids, parting_words(kids))]))
        tree.root.expand()
        tree.focus()
        if cursor is not None:  # on the branch shown, now: keys typed ahead act from there
            line = 0
            while (at := tree.get_node_at_line(line)) is not None and at is not cursor:
                line += 1
            if at is not None:
                tree.move_cursor_to_line(line)
                self.call_after_refresh(lambda: tree.scroll_to_line(tree.cursor_line,
                                                                    animate=False))

    def on_tree_node_selected(self, event: Tree.NodeSelected[BranchLine]) -> None:
        event.stop()
        if event.node.data is not None:
            self.dismiss(event.node.data.node)

    def action_move(self, action: str) -> None:
        getattr(self.query_one(Tree), f"action_{action}")()

    def action_open(self) -> None:
        node = self.query_one(Tree).cursor_node
        if node is not None and node.data is not None:
            self.dismiss(node.data.node)

    def action_close(self) -> None:
        self.dismiss(None)
