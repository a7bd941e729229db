"""The binding's guards: a library that does not match the binding, a model
closed while it is in use, paths that are not UTF-8 and integers that ctypes
would wrap."""

import ctypes
import os
import shutil
import threading
import time

import pytest

import colibri
from colibri import _ffi


# ----------------------------------------------------------------------------- library and binding versions


class _LibraryWith:
    """The real library, with some functions replaced."""

    def __init__(self, real, **replaced):
        self._real = real
        self._replaced = replaced

    def __getattr__(self, name):
        if name in self._replaced:
            return self._replaced[name]
        return getattr(self._real, name)


def _reporting_size(function, size):
    def default():
        value = function()
        value.struct_size = size
        return value

    return default


_MIXTRAL = "mixtral-tiny"
_CALLS = {
    "colibri_inference_params_default": lambda model, path: model.generate("hi", max_tokens=1),
    "colibri_load_options_default": lambda model, path: colibri.Model(path),
    "colibri_expert_cache_options_default": lambda model, path: model.enable_expert_cache(8),
    "colibri_router_config_default": lambda model, path: colibri.Router(8, 2, normalize=True),
}


@pytest.mark.parametrize("function", sorted(_CALLS))
@pytest.mark.parametrize("delta", [8, -8])
def test_a_default_struct_of_another_size_is_refused(function, delta, fixture_path, monkeypatch):
    path = fixture_path(_MIXTRAL)
    model = colibri.Model(path)
    real = _ffi.lib()
    size = getattr(real, function)().struct_size
    monkeypatch.setattr(_ffi, "lib", lambda: _LibraryWith(real, **{function: _reporting_size(getattr(real, function),
                                                                                             size + delta)}))
    with pytest.raises(colibri.LibraryVersionError, match=f"struct_size {size + delta} .* is {size} bytes: the "
                                                          "library and the Python binding are from different"):
        _CALLS[function](model, path)


def test_an_older_inference_params_layout_is_refused(mixtral, monkeypatch):
    # The library takes this layout (from before exact_prompt), ignoring the field it lacks.
    real = _ffi.lib()
    older = _ffi.InferenceParams.exact_prompt.offset
    monkeypatch.setattr(_ffi, "lib", lambda: _LibraryWith(real, colibri_inference_params_default=_reporting_size(
        real.colibri_inference_params_default, older)))
    with pytest.raises(colibri.LibraryVersionError, match="different colibri versions"):
        mixtral.generate("hi", max_tokens=1, exact_prompt=True)


def test_a_library_without_a_function_of_the_binding_says_so(monkeypatch):
    monkeypatch.setattr(_ffi, "_lib", None)  # load it again
    monkeypatch.setattr(_ffi, "_PROTOTYPES", {**_ffi._PROTOTYPES, "colibri_from_the_future": (None, [])})
    with pytest.raises(colibri.LibraryVersionError,
                       match="has no function colibri_from_the_future: the library is older than this Python binding"):
        _ffi.lib()


# ----------------------------------------------------------------------------- closing a model in use


def test_close_waits_for_a_generation_in_progress(fixture_path):
    model = colibri.Model(fixture_path(_MIXTRAL))
    in_callback = threading.Event()
    closed = threading.Event()
    seen = []

    def slow(piece):
        if not in_callback.is_set():
            in_callback.set()
            time.sleep(0.3)  # close() is called meanwhile
            seen.append(closed.is_set())
            # Allowed although close() waits: it waits for this very generation.
            seen.append(model.tokenize("hi").tolist())

    def close():
        in_callback.wait(10)
        model.close()
        closed.set()

    closer = threading.Thread(target=close)
    closer.start()
    result = model.generate("The quick brown fox", max_tokens=8, ignore_eos=True, on_text=slow)
    closer.join(10)
    assert closed.is_set()
    assert seen[0] is False and len(seen[1]) > 0
    assert len(result.tokens) == 8 and result.text
    for call in (lambda: model.generate("hi"), lambda: model.tokenize("hi"), lambda: model.info,
                 lambda: model.set_cache_policy(colibri.CACHE_LRU), lambda: model.enable_expert_cache(8)):
        with pytest.raises(ValueError, match="the model is closed"):
            call()
    model.close()  # twice is harmless


def test_close_or_enable_expert_cache_from_a_callback_raises(fixture_path):
    model = colibri.Model(fixture_path(_MIXTRAL))
    with pytest.raises(RuntimeError, match=r"close\(\) was called from inside a call on the same model"):
        model.generate("The quick brown fox", max_tokens=4, on_text=lambda piece: model.close())
    with pytest.raises(RuntimeError, match=r"enable_expert_cache\(\) was called from inside"):
        model.generate("The quick brown fox", max_tokens=4, on_text=lambda piece: model.enable_expert_cache(8))
    assert len(model.generate("The quick brown fox", max_tokens=4, ignore_eos=True).tokens) == 4  # still open


def test_generate_from_a_callback_without_an_expert_cache(mixtral):
    nested = []
    mixtral.generate("The quick brown fox", max_tokens=2, ignore_eos=True,
                     on_text=lambda piece: nested.append(mixtral.generate("hi", max_tokens=2).tokens.tolist()))
    assert nested and all(len(tokens) == 2 for tokens in nested)


# ----------------------------------------------------------------------------- paths and integers


def test_a_path_that_is_not_utf8(fixture_path, tmp_path):
    name = b"mod\xe8le-latin1.gguf"  # Latin-1: not UTF-8
    path = tmp_path / os.fsdecode(name)
    shutil.copyfile(fixture_path(_MIXTRAL) / "model.gguf", path)
    for given in (path, str(path), os.fsencode(path)):
        model = colibri.Model(given)
        assert os.fsencode(model.info.path).endswith(b"/" + name)
        assert len(model.generate("The quick brown fox", max_tokens=3, ignore_eos=True).tokens) == 3
    with pytest.raises(colibri.LoadError, match="no such file"):
        colibri.Model(tmp_path / os.fsdecode(b"absent-\xe8"))


def test_integers_out_of_their_c_range_raise_value_error(fixture_path):
    model = colibri.Model(fixture_path(_MIXTRAL))
    router = colibri.Router(8, 2)
    cases = [
        (lambda: model.set_cache_policy(2**32 + 1), r"policy = 4294967297 is outside the range \[-2\*\*31, 2\*\*31\)"),
        (lambda: router.set_cache_policy(-(2**32) + 1), r"policy = -4294967295 is outside the range"),
        (lambda: model.enable_expert_cache(-1), r"budget_mb = -1 is outside the range \[0, 2\*\*64\)"),
        (lambda: model.enable_expert_cache(2**64 + 8), r"budget_mb = 18446744073709551624 is outside the range"),
        (lambda: model.enable_expert_cache(8, policy=2**31), r"policy = 2147483648 is outside the range"),
        (lambda: model.generate("hi", max_tokens=2**32), r"max_tokens = 4294967296 is outside the range"),
    ]
    for call, message in cases:
        with pytest.raises(ValueError, match=message):
            call()
    assert ctypes.c_int(2**32 + 1).value == 1  # what ctypes would have passed
