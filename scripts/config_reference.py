"""Write docs/config.md, the run config's reference, from the fields of src/evotrainer/config.py.

    python scripts/config_reference.py

Run it after changing a key; tests/test_config_reference.py fails while the page is stale.
"""
from pathlib import Path

from evotrainer.config import reference

PAGE = Path(__file__).resolve().parents[1] / "docs" / "config.md"

if __name__ == "__main__":
    PAGE.write_text(reference())
    print(f"wrote {PAGE}")
