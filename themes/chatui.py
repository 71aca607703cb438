"""Theme definitions: a dark and a light theme, each with the logprob heat scale.

The heat scale is five CSS variables, ``$heat-0`` (the model was sure) to ``$heat-4`` (a
surprise). Any Textual theme works with the app: variables a theme does not define fall back
to :func:`heat_variable_defaults` (a dark scale or a light one, as the theme is).
"""

from __future__ import annotations

from textual.theme import Theme

HEAT_BINS: tuple[float, ...] = (0.9, 0.6, 0.3, 0.1)
"""Probability thresholds: p >= 0.9 is bin 0, >= 0.6 bin 1, ... below 0.1 bin 4."""

HEAT_LABELS: tuple[str, ...] = ("≥90%", "≥60%", "≥30%", "≥10%", "<10%")


def heat_bin(prob: float) -> int:
    """The heat bin (0 sure .. 4 surprising) of a token probability (a token with none has no
    heat colour: the token view draws it plain)."""
    for i, threshold in enumerate(HEAT_BINS):
        if prob >= threshold:
            return i
    return len(HEAT_BINS)


HEAT_VARIABLE_DEFAULTS: dict[str, str] = {
    "heat-0": "#7fb3d5",
    "heat-1": "#76c893",
    "heat-2": "#e9c46a",
    "heat-3": "#f4a261",
    "heat-4": "#f25c68",
}
"""The heat scale of a dark theme that has none (Textual's own): at least 3:1 against the
background of each of Textual 8's dark themes (WCAG's floor for what must be told apart;
`tests/test_themes.py`)."""

DARK = Theme(
    name="chatui-dark",
    primary="#5fafd7",
    secondary="#87af87",
    accent="#d7af5f",
    foreground="#d0d0d0",
    background="#1c1c1c",
    surface="#262626",
    panel="#303030",
    success="#87d787",
    warning="#ffaf5f",
    error="#ff5f5f",
    dark=True,
    variables={
        "heat-0": "#8fb8de",
        "heat-1": "#7fd1a0",
        "heat-2": "#e8d06a",
        "heat-3": "#f39c4a",
        "heat-4": "#ff4d5e",
            "footer-key-foreground": "#5fafd7",
        "block-cursor-background": "#5fafd7",
    },
)

LIGHT = Theme(
    name="chatui-light",
    primary="#005f87",
    secondary="#5f8700",
    accent="#af5f00",
    foreground="#1c1c1c",
    background="#fafafa",
    surface="#eeeeee",
    panel="#e4e4e4",
    success="#2e7d32",
    warning="#b35900",
    error="#c62828",
    dark=False,
    variables={
        "heat-0": "#2a5d9f",
        "heat-1": "#237a46",
        "heat-2": "#8a6d00",
        "heat-3": "#c25400",
        "heat-4": "#c8102e",
        "footer-key-foreground": "#005f87",
    },
)

HEAT_VARIABLE_DEFAULTS_LIGHT: dict[str, str] = {
    key: value for key, value in LIGHT.variables.items() if key.startswith("heat-")}
"""The heat scale of a light theme that has none: chatui-light's (the dark scale's pale blue
and yellow were 1.3-1.6:1 on Textual's light themes, unreadable)."""


def heat_variable_defaults(dark: bool) -> dict[str, str]:
    """The heat scale for a theme that defines none, by whether the theme is dark."""
    return dict(HEAT_VARIABLE_DEFAULTS if dark else HEAT_VARIABLE_DEFAULTS_LIGHT)


THEMES: tuple[Theme, ...] = (DARK, LIGHT)
DEFAULT_THEME = DARK.name
