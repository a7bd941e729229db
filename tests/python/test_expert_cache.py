"""The expert cache through the binding: a .colibri model with a bounded
expert budget gives the tokens it gives without one, and its counters show
the reads (docs/EXPERT_STORE.md)."""

import subprocess

import pytest

import colibri


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
    with pytest.raises(colibri.UnsupportedError):
        colibri.Model(fixture_path("olmoe-tiny")).enable_expert_cache(8)  # not a .colibri file
