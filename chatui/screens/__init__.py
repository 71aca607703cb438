"""chatui's screens: the chat screen and the help screen."""
