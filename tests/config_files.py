"""Writing a Hugging Face config.json for a test and reading its one-line refusal (the model-config tests' helpers)."""

from __future__ import annotations

import json

import pytest

from pipesim.errors import PipesimError
from pipesim.model.hf_config import load_hf_config


def write_config(tmp_path, cfg: dict) -> str:
    """`cfg` as tmp_path/config.json; its path."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    return str(path)


def config_refusal(path: str) -> str:
    """The one-line PipesimError loading `path` raises."""
    with pytest.raises(PipesimError) as err:
        load_hf_config(path)
    assert "\n" not in str(err.value)
    return str(err.value)
