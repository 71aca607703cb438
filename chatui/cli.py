"""Command line (placeholder until the engine lands)."""


def main() -> None:
    print("chatui")
