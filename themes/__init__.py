"""chatui's Textual themes (with the logprob heat scale) and its stylesheet."""

from pathlib import Path

from .chatui import DEFAULT_THEME, HEAT_BINS, THEMES, heat_bin, heat_variable_defaults

STYLESHEET = Path(__file__).with_name("chatui.tcss")

__all__ = ["DEFAULT_THEME", "HEAT_BINS", "STYLESHEET", "THEMES", "heat_bin",
           "heat_variable_defaults"]
