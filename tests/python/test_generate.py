"""Model loading, tokenization and generation through the binding, checked
against the colibri-run binary and the fixtures' reference outputs."""

import ctypes
import json
import subprocess

import numpy as np
import pytest

import colibri
from conftest import FIXTURES


def run_colibri_run(colibri_run, model_dir, prompt, tmp_path, *extra):
    """colibri-run's printed text (bytes, without the newline it ends with)
    and its generated token ids."""
    prompt_file = tmp_path / "prompt.txt"
    prompt_file.write_bytes(prompt.encode())
    logits = tmp_path / "out.json"
    done = subprocess.run(
        [str(colibri_run), "--model", str(model_dir), "--prompt-file", str(prompt_file), "--quiet",
         "--logits-out", str(logits), *extra],
        capture_output=True, check=True, timeout=120)
    assert done.stdout.endswith(b"\n")
    generated = json.loads(logits.read_text())["prompts"][0]["generated"]["tokens"]
    return done.stdout[:-1], generated


@pytest.mark.parametrize("fixture", FIXTURES)
def test_greedy_generation_equals_colibri_run(fixture, fixture_path, colibri_run, tmp_path):
    reference = json.loads((fixture_path(fixture) / "reference.json").read_text())
    model = colibri.Model(fixture_path(fixture))
    for entry in reference["prompts"]:
        prompt = entry["prompt"]
        text, tokens = run_colibri_run(colibri_run, fixture_path(fixture), prompt, tmp_path,
                                       "--max-tokens", "32", "--ignore-eos")
        result = model.generate(prompt, max_tokens=32, ignore_eos=True)
        assert result.tokens.tolist() == tokens
        assert result.tokens.tolist() == entry["generated"]["tokens"]
        assert result.text_bytes == text
        assert result.finish_reason == "length"
        assert result.n_prompt_tokens == len(entry["tokens"])


def test_default_generation_equals_colibri_run_default(mixtral, fixture_path, colibri_run, tmp_path):
    # colibri-run's defaults: greedy, 128 tokens, stop at end-of-sequence.
    prompt = "Once upon a time"
    text, tokens = run_colibri_run(colibri_run, fixture_path("mixtral-tiny"), prompt, tmp_path)
    result = mixtral.generate(prompt)
    assert result.tokens.tolist() == tokens
    assert result.text_bytes == text


def test_sampled_generation_equals_colibri_run(mixtral, fixture_path, colibri_run, tmp_path):
    prompt = "The experts argue"
    text, tokens = run_colibri_run(colibri_run, fixture_path("mixtral-tiny"), prompt, tmp_path,
                                   "--max-tokens", "40", "--ignore-eos", "--temperature", "0.8", "--top-p", "0.9",
                                   "--top-k", "50", "--seed", "1234", "--repeat-penalty", "1.1")
    result = mixtral.generate(prompt, max_tokens=40, ignore_eos=True, temperature=0.8, top_p=0.9, top_k=50,
                              seed=1234, repetition_penalty=1.1)
    assert result.tokens.tolist() == tokens
    assert result.text_bytes == text


def test_generation_from_token_ids(mixtral):
    prompt = "The quick brown fox"
    ids = mixtral.tokenize(prompt)
    by_text = mixtral.generate(prompt, max_tokens=16, ignore_eos=True)
    for form in (ids, ids.tolist(), ids.astype(np.int64)):
        by_ids = mixtral.generate(form, max_tokens=16, ignore_eos=True)
        assert by_ids.tokens.tolist() == by_text.tokens.tolist()
        assert by_ids.n_prompt_tokens == len(ids)


def test_streaming_stop_and_cancel(mixtral):
    prompt = "The quick brown fox"
    full = mixtral.generate(prompt, max_tokens=24, ignore_eos=True)
    pieces = []
    streamed = mixtral.generate(prompt, max_tokens=24, ignore_eos=True, on_text=pieces.append)
    assert "".join(pieces) == full.text == streamed.text

    calls = []
    cancelled = mixtral.generate(prompt, max_tokens=24, ignore_eos=True,
                                 on_text=lambda piece: calls.append(piece) or len(calls) < 2)
    assert cancelled.finish_reason == "cancelled"
    assert len(calls) == 2
    assert cancelled.text == "".join(calls)

    def boom(piece):
        raise KeyError("from the callback")

    with pytest.raises(KeyError, match="from the callback"):
        mixtral.generate(prompt, max_tokens=8, on_text=boom)

    stop = full.text_bytes[6:9].decode("utf-8", errors="ignore") or full.text[:2]
    stopped = mixtral.generate(prompt, max_tokens=24, ignore_eos=True, stop=["zzzz-never", stop])
    assert stopped.finish_reason == "stop"
    assert stopped.text == full.text[: full.text.find(stop)]

    n_prompt = full.n_prompt_tokens
    short = mixtral.generate(prompt, max_tokens=10**9, ignore_eos=True, n_ctx=n_prompt + 3)
    assert short.finish_reason == "context_full"
    assert short.tokens.tolist() == full.tokens[:4].tolist()


def test_errors_are_exceptions_with_messages(mixtral, fixture_path):
    with pytest.raises(colibri.LoadError, match="colibri_load_model"):
        colibri.Model("/nonexistent/model")
    with pytest.raises(colibri.InvalidArgumentError, match="temperature"):
        mixtral.generate("hi", temperature=-1.0)
    with pytest.raises(colibri.InvalidArgumentError, match="top_p"):
        mixtral.generate("hi", top_p=0.0)
    with pytest.raises(colibri.InvalidArgumentError, match="max_tokens"):
        mixtral.generate("hi", max_tokens=-3)
    # C reads a stop string up to a NUL: "a\0b" would have stopped at "a".
    with pytest.raises(colibri.InvalidArgumentError, match=r"stop\[1\] contains a NUL"):
        mixtral.generate("hi", stop=["fine", "a\0b"])
    with pytest.raises(colibri.OutOfRangeError, match="n_ctx"):
        mixtral.generate("hi", n_ctx=10**6)
    with pytest.raises(colibri.ContextFullError):
        mixtral.generate("The quick brown fox jumps", n_ctx=2)
    with pytest.raises(colibri.OutOfRangeError, match="prompt\\[1\\] = 512"):
        mixtral.generate([51, 512])
    with pytest.raises(colibri.OutOfRangeError):
        mixtral.generate([51, 2**40])
    with pytest.raises(colibri.InvalidArgumentError):
        mixtral.generate([])
    with pytest.raises(colibri.InvalidArgumentError, match="the prompt is empty"):
        mixtral.generate("")
    with pytest.raises(colibri.OutOfRangeError, match="tokens\\[0\\]"):
        mixtral.detokenize([-1])
    with pytest.raises(colibri.UnsupportedError):
        mixtral.set_cache_policy(colibri.CACHE_LFU)
    err = None
    try:
        mixtral.generate("hi", top_k=-1)
    except colibri.ColibriError as caught:
        err = caught
    assert err is not None and err.status_name == "COLIBRI_ERR_INVALID_ARGUMENT" and "top_k" in err.message


def test_model_info(mixtral):
    info = mixtral.info
    assert (info.arch, info.arch_name, info.weight_scheme) == ("mixtral", "Mixtral", "f32")
    assert (info.n_layers, info.n_experts, info.top_k, info.vocab, info.hidden) == (2, 8, 2, 512, 64)
    assert info.norm_top_k is True
    assert info.eos_token_id == 506
    assert info.weight_bytes > 0
    assert colibri.version().count(".") == 2
    assert colibri.kernels() in {"scalar", "avx2", "avx512", "amx", "neon"}


def test_tokenize_matches_reference(mixtral, fixture_path):
    reference = json.loads((fixture_path("mixtral-tiny") / "reference.json").read_text())
    for entry in reference["prompts"]:
        ids = mixtral.tokenize(entry["prompt"])
        assert ids.dtype == np.int32
        assert ids.tolist() == entry["tokens"]
        assert mixtral.detokenize(ids) == entry["prompt"]
    special = mixtral.tokenize("<|im_start|>", parse_special=True)
    assert special.tolist() == [507]
    assert mixtral.detokenize(special, skip_special=True) == ""
    assert len(mixtral.tokenize("<|im_start|>")) > 1
    assert mixtral.tokenize("").tolist() == []


def test_weights_memory_kinds_generate_the_same_tokens(fixture_path, build_dir, tmp_path):
    path = tmp_path / "olmoe-int8.colibri"
    subprocess.run([str(build_dir / "tools" / "colibri-convert"), "--input", str(fixture_path("olmoe-tiny")),
                    "--output", str(path), "--quant", "int8", "--no-progress"], check=True, timeout=120)
    outputs = {}
    for weights in ("map", "copy", "auto"):
        with colibri.Model(path, weights=weights) as model:
            outputs[weights] = model.generate("The experts argue.", max_tokens=12, ignore_eos=True).tokens.tolist()
    assert len(outputs["map"]) == 12
    assert outputs["copy"] == outputs["map"] == outputs["auto"]
    with pytest.raises(ValueError, match="weights must be one of"):
        colibri.Model(path, weights="mmap")


def test_ctypes_structs_match_the_library():
    """The binding's ctypes layouts are the header's: the library writes its
    own sizeof into struct_size."""
    from colibri import _ffi
    params = _ffi.lib().colibri_inference_params_default()
    assert params.struct_size == ctypes.sizeof(_ffi.InferenceParams)


def test_logit_bias_and_logprobs(fixture_path):
    model = colibri.Model(fixture_path("mixtral-tiny"))
    prompt = "The quick brown fox"
    greedy = model.generate(prompt, max_tokens=5, ignore_eos=True, logprobs=3)
    assert greedy.logprobs.shape == (5,)
    assert len(greedy.top_logprobs) == 5
    for token, logprob, top in zip(greedy.tokens.tolist(), greedy.logprobs.tolist(), greedy.top_logprobs):
        assert len(top) == 3
        assert top[0] == (token, pytest.approx(logprob))  # greedy takes the most likely
        assert top[0][1] >= top[1][1] >= top[2][1]
        assert logprob <= 0
    forced = model.generate(prompt, max_tokens=4, ignore_eos=True, logit_bias={300: 100}, logprobs=0)
    assert forced.tokens.tolist() == [300] * 4
    assert forced.top_logprobs == [[], [], [], []]
    assert (forced.logprobs < -1).all()  # the model's own odds, not the biased ones
    plain = model.generate(prompt, max_tokens=2)
    assert plain.logprobs is None and plain.top_logprobs is None
    with pytest.raises(colibri.InvalidArgumentError, match="logprobs"):
        model.generate(prompt, max_tokens=2, logprobs=21)
    with pytest.raises(colibri.OutOfRangeError, match="logit_bias_tokens"):
        model.generate(prompt, max_tokens=2, logit_bias={10**6: 1.0})


def test_json_object(fixture_path):
    model = colibri.Model(fixture_path("mixtral-tiny"))
    # The id whose text is "}" alone (SentencePiece may tokenize "}" with a leading space).
    closing = next(i for i in range(model.info.vocab) if model.detokenize_bytes([i]) == b"}")
    result = model.generate("The quick brown fox", max_tokens=40, ignore_eos=True, json_object=True,
                            logit_bias={closing: 100})
    assert result.text == "{}"
    assert result.finish_reason == "json_complete"
    sampled = model.generate("The quick brown fox", max_tokens=24, temperature=1.0, seed=4, json_object=True)
    assert sampled.text.startswith("{")
    assert sampled.finish_reason in ("json_complete", "length")
    if sampled.finish_reason == "json_complete":
        assert isinstance(json.loads(sampled.text), dict)


def test_exact_prompt_reaches_the_library(fixture_path):
    # f32 weights take f32 activations in every mode, so the tokens agree; a
    # params struct whose layout disagreed with the library's would be refused.
    model = colibri.Model(fixture_path("mixtral-tiny"))
    default = model.generate("The quick brown fox", max_tokens=6, ignore_eos=True)
    exact = model.generate("The quick brown fox", max_tokens=6, ignore_eos=True, exact_prompt=True)
    assert list(exact.tokens) == list(default.tokens)
