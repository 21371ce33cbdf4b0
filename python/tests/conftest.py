import os

import pytest

# Plans read the catalog's bands, never a decisions file a `tune` run left on this machine
# (flashrt_structures.decisions); the tests of that file name theirs.
os.environ["FLASHRT_DECISIONS"] = "off"

# Tests never reach a hub.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def pytest_collection_modifyitems(config, items):
    """A test that loads a real checkpoint is slow: `-m "not slow"` (scripts/test.sh --quick)
    is the one selector."""
    for item in items:
        if item.get_closest_marker("real_model") is not None:
            item.add_marker(pytest.mark.slow)
