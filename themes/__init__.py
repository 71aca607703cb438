"""chatui's Textual themes and stylesheet."""
