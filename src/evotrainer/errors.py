"""User-facing errors: the CLI prints them as one line and exits with code 2."""


class UsageError(Exception):
    """Bad input from the user (unknown name, malformed file, missing checkpoint)."""


def unknown(kind: str, name: str, valid) -> UsageError:
    return UsageError(f"unknown {kind} '{name}'; valid choices: {', '.join(sorted(valid))}")


class HarnessFailed(RuntimeError):
    """Harness code was refused or failed: `label` is illegal, crash, timeout or oom."""

    def __init__(self, label: str, detail: str, log_tail: str = ""):
        self.label, self.detail, self.log_tail = label, detail, log_tail
        super().__init__(f"{label}: {detail}")
