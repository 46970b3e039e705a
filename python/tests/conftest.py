import os
import pathlib

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture
def golden_dir() -> pathlib.Path:
    return pathlib.Path(os.environ.get("GRADZIP_GOLDEN_DIR", REPO / "tests" / "golden"))
