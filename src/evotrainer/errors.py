"""User-facing errors: the CLI prints them as one line and exits with code 2."""


class UsageError(Exception):
    """Bad input from the user (unknown name, malformed file, missing checkpoint)."""


def unknown(kind: str, name: str, valid) -> UsageError:
    return UsageError(f"unknown {kind} '{name}'; valid choices: {', '.join(sorted(valid))}")
