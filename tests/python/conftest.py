"""Shared setup of the binding's tests. tests/scripts/python_binding.sh runs
them with COLIBRI_LIBRARY (the built libcolibri.so), COLIBRI_BUILD_DIR (for
colibri-run) and COLIBRI_TEST_DATA_DIR set; without them the repository's
build/ and tests/data are used."""

import os
import pathlib
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bindings" / "python"))

FIXTURES = ["mixtral-tiny", "qwen2moe-tiny", "qwen3moe-tiny", "olmoe-tiny"]


@pytest.fixture(scope="session")
def data_dir() -> pathlib.Path:
    return pathlib.Path(os.environ.get("COLIBRI_TEST_DATA_DIR", REPO / "tests" / "data"))


@pytest.fixture(scope="session")
def build_dir() -> pathlib.Path:
    return pathlib.Path(os.environ.get("COLIBRI_BUILD_DIR", REPO / "build"))


@pytest.fixture(scope="session")
def colibri_run(build_dir) -> pathlib.Path:
    path = build_dir / "tools" / "colibri-run"
    assert path.exists(), f"{path} is not built"
    return path


@pytest.fixture(scope="session")
def fixture_path(data_dir):
    return lambda name: data_dir / "fixtures" / name


@pytest.fixture(scope="session")
def mixtral(fixture_path):
    import colibri

    return colibri.Model(fixture_path("mixtral-tiny"))
