"""The expert cache through the binding: a .colibri model with a bounded
expert budget gives the tokens it gives without one, and its counters show
the reads (docs/EXPERT_STORE.md)."""

import os
import subprocess
import sys
import textwrap
import threading
import time

import pytest

import colibri
from conftest import REPO


@pytest.fixture(scope="module")
def olmoe_colibri(fixture_path, build_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("cache") / "olmoe-int8.colibri"
    subprocess.run([str(build_dir / "tools" / "colibri-convert"), "--input", str(fixture_path("olmoe-tiny")),
                    "--output", str(out), "--quant", "int8", "--no-progress"],
                   capture_output=True, check=True, timeout=120)
    return out


def greedy(model):
    return model.generate("The quick brown fox", max_tokens=24, ignore_eos=True).tokens.tolist()


def test_cached_model_gives_the_same_tokens_and_counts_its_reads(olmoe_colibri):
    want = greedy(colibri.Model(olmoe_colibri))
    model = colibri.Model(olmoe_colibri)
    assert model.expert_cache_stats()["budget_bytes"] == 0
    model.enable_expert_cache(1, preload="off")
    assert greedy(model) == want
    stats = model.expert_cache_stats()
    assert stats["budget_bytes"] > 0
    assert stats["misses"] > 0 and stats["hits"] > 0
    assert stats["bytes_read"] > 0 and stats["preload_bytes"] == 0
    model.set_cache_policy(colibri.CACHE_LFU)
    assert greedy(model) == want


def test_preload_reads_every_expert_up_front(olmoe_colibri):
    model = colibri.Model(olmoe_colibri)
    model.enable_expert_cache(64)  # the tiny model's experts all fit: "auto" preloads them
    stats = model.expert_cache_stats()
    assert stats["preload_bytes"] > 0 and stats["bytes_read"] == stats["preload_bytes"]
    greedy(model)
    after = model.expert_cache_stats()
    assert after["misses"] == 0 and after["bytes_read"] == stats["bytes_read"]


def test_bad_cache_options_are_refused(olmoe_colibri, fixture_path):
    model = colibri.Model(olmoe_colibri)
    with pytest.raises(ValueError, match="io must be one of"):
        model.enable_expert_cache(8, io="disk")
    with pytest.raises(colibri.InvalidArgumentError):
        model.enable_expert_cache(0)
    with pytest.raises(colibri.InvalidArgumentError, match="pinned contains a NUL"):
        model.enable_expert_cache(8, pinned="0:1\x000:2")
    with pytest.raises(colibri.UnsupportedError):
        colibri.Model(fixture_path("olmoe-tiny")).enable_expert_cache(8)  # not a .colibri file


def test_enable_expert_cache_waits_for_a_generation_in_progress(olmoe_colibri):
    model = colibri.Model(olmoe_colibri)
    want = greedy(model)
    in_callback = threading.Event()
    enabled = threading.Event()
    seen = []

    def slow(piece):
        if not in_callback.is_set():
            in_callback.set()
            time.sleep(0.3)  # enable_expert_cache() is called meanwhile
            seen.append(enabled.is_set())

    def enable():
        in_callback.wait(10)
        model.enable_expert_cache(1, preload="off")
        enabled.set()

    enabler = threading.Thread(target=enable)
    enabler.start()
    result = model.generate("The quick brown fox", max_tokens=24, ignore_eos=True, on_text=slow)
    enabler.join(30)
    assert enabled.is_set() and seen == [False]
    assert result.tokens.tolist() == want
    assert greedy(model) == want and model.expert_cache_stats()["misses"] > 0


def test_generate_from_a_callback_with_an_expert_cache_raises(olmoe_colibri):
    # In a child process: without the guard this deadlocks in the library.
    script = textwrap.dedent("""
        import sys
        import colibri
        model = colibri.Model(sys.argv[1])
        model.enable_expert_cache(64)
        try:
            model.generate("The quick brown fox", max_tokens=4, ignore_eos=True,
                           on_text=lambda piece: model.generate("again", max_tokens=2))
        except RuntimeError as exc:
            print("RuntimeError:", exc)
        print(len(model.generate("The quick brown fox", max_tokens=4, ignore_eos=True).tokens))
    """)
    env = dict(os.environ, PYTHONPATH=str(REPO / "bindings" / "python"))
    done = subprocess.run([sys.executable, "-c", script, str(olmoe_colibri)], capture_output=True, text=True,
                          timeout=60, env=env)
    assert done.returncode == 0, done.stderr
    assert "RuntimeError: generate() was called from an on_text callback" in done.stdout
    assert done.stdout.endswith("\n4\n")
