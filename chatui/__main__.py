"""``python -m chatui``."""

from .cli import main

if __name__ == "__main__":  # guarded: the isolated inference process re-imports __main__
    main()
