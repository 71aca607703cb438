"""The ``chatui`` command line (``chatui.cli:main`` is the console script).

options.py: the flags, defined once as frozen option groups every command shares;
headless.py: loading and streaming without the UI; output.py: what the commands print;
commands.py: the commands themselves.
"""

from .commands import app, main

__all__ = ["app", "main"]
