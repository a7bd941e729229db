"""ctypes declarations of colibri.h and the loading of libcolibri.so.

The library is looked up, on first use, in this order:
  1. the COLIBRI_LIBRARY environment variable (path of the .so),
  2. $COLIBRI_BUILD_DIR/lib/libcolibri.so,
  3. <repository>/build*/lib/libcolibri.so (the newest, when this package is
     used from a source checkout),
  4. the system's library path (ctypes.util.find_library("colibri")).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import pathlib
import threading

ABI_VERSION = 1

# colibri_status
OK = 0
ERR_INVALID_ARGUMENT = 1
ERR_NULL_POINTER = 2
ERR_LOAD = 3
ERR_OUT_OF_RANGE = 4
ERR_CONTEXT_FULL = 5
ERR_UNSUPPORTED = 6
ERR_OUT_OF_MEMORY = 7
ERR_INTERNAL = 8

TOKENIZE_ADD_SPECIAL = 1
TOKENIZE_PARSE_SPECIAL = 2
DETOKENIZE_SKIP_SPECIAL = 1

CACHE_LRU = 0
CACHE_LFU = 1
CACHE_FIFO = 2

FINISH_REASONS = {0: "length", 1: "eos", 2: "stop", 3: "context_full", 4: "cancelled", 5: "json_complete"}

c_size_t = ctypes.c_size_t
c_int32 = ctypes.c_int32
c_uint32 = ctypes.c_uint32
c_uint64 = ctypes.c_uint64
c_float = ctypes.c_float
c_void_p = ctypes.c_void_p
c_char_p = ctypes.c_char_p


class LoadOptions(ctypes.Structure):
    _fields_ = [("struct_size", c_size_t), ("verify_checksums", c_int32)]


class ModelStats(ctypes.Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("arch", c_char_p),
        ("arch_name", c_char_p),
        ("weight_scheme", c_char_p),
        ("path", c_char_p),
        ("n_layers", c_int32),
        ("n_moe_layers", c_int32),
        ("hidden", c_int32),
        ("n_heads", c_int32),
        ("n_kv_heads", c_int32),
        ("head_dim", c_int32),
        ("vocab", c_int32),
        ("n_experts", c_int32),
        ("top_k", c_int32),
        ("norm_top_k", c_int32),
        ("expert_ff", c_int32),
        ("shared_ff", c_int32),
        ("max_positions", c_int32),
        ("bos_token_id", c_int32),
        ("eos_token_id", c_int32),
        ("weight_bytes", c_uint64),
        ("expert_cache_bytes", c_uint64),
        ("expert_cache_hits", c_uint64),
        ("expert_cache_misses", c_uint64),
        ("expert_cache_bytes_read", c_uint64),
        ("expert_cache_stall_ns", c_uint64),
        ("expert_cache_preload_bytes", c_uint64),
        ("expert_cache_preload_ns", c_uint64),
    ]


class ExpertCacheOptions(ctypes.Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("budget_mb", c_uint64),
        ("policy", c_int32),
        ("io", c_int32),
        ("prefetch", c_int32),
        ("pinned_experts", c_char_p),
        ("preload", c_int32),
    ]


# int (*)(const char* text, size_t len, void* user_data)
TEXT_CALLBACK = ctypes.CFUNCTYPE(ctypes.c_int, c_void_p, c_size_t, c_void_p)


class InferenceParams(ctypes.Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("max_tokens", c_int32),
        ("n_ctx", c_int32),
        ("temperature", c_float),
        ("top_k", c_int32),
        ("top_p", c_float),
        ("min_p", c_float),
        ("repetition_penalty", c_float),
        ("presence_penalty", c_float),
        ("frequency_penalty", c_float),
        ("penalty_last_n", c_int32),
        ("seed", c_uint64),
        ("ignore_eos", c_int32),
        ("add_special_tokens", c_int32),
        ("parse_special", c_int32),
        ("stop", ctypes.POINTER(c_char_p)),
        ("n_stop", c_size_t),
        ("on_text", TEXT_CALLBACK),
        ("user_data", c_void_p),
        ("logit_bias_tokens", ctypes.POINTER(c_int32)),
        ("logit_bias_values", ctypes.POINTER(c_float)),
        ("n_logit_bias", c_size_t),
        ("logprobs", c_int32),
        ("json_object", c_int32),
        ("exact_prompt", c_int32),
    ]


class TopLogprob(ctypes.Structure):
    _fields_ = [("token", c_int32), ("logprob", c_float)]


class Result(ctypes.Structure):
    _fields_ = [
        ("tokens", ctypes.POINTER(c_int32)),
        ("n_tokens", c_size_t),
        ("text", c_void_p),  # char*, may hold NUL bytes: read text_len bytes
        ("text_len", c_size_t),
        ("n_prompt_tokens", c_size_t),
        ("finish_reason", c_int32),
        ("token_logprobs", ctypes.POINTER(c_float)),
        ("top_logprobs", ctypes.POINTER(TopLogprob)),
        ("n_top_logprobs", c_int32),
    ]


class RouterConfig(ctypes.Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("num_experts", c_int32),
        ("top_k", c_int32),
        ("normalize", c_int32),
    ]


_P = ctypes.POINTER
_PROTOTYPES = {
    # name: (restype, argtypes)
    "colibri_last_error": (c_char_p, []),
    "colibri_status_name": (c_char_p, [ctypes.c_int]),
    "colibri_version": (c_char_p, []),
    "colibri_abi_version": (c_int32, []),
    "colibri_kernels": (c_char_p, []),
    "colibri_load_options_default": (LoadOptions, []),
    "colibri_load_model": (ctypes.c_int, [c_char_p, _P(LoadOptions), _P(c_void_p)]),
    "colibri_load_model_with_memory": (ctypes.c_int, [c_char_p, _P(LoadOptions), ctypes.c_int32, _P(c_void_p)]),
    "colibri_unload_model": (None, [c_void_p]),
    "colibri_model_info": (ctypes.c_int, [c_void_p, _P(ModelStats)]),
    "colibri_expert_cache_options_default": (ExpertCacheOptions, []),
    "colibri_model_enable_expert_cache": (ctypes.c_int, [c_void_p, _P(ExpertCacheOptions)]),
    "colibri_tokenize": (ctypes.c_int, [c_void_p, c_char_p, c_uint32, _P(c_void_p), _P(c_size_t)]),
    "colibri_free_tokens": (None, [c_void_p]),
    "colibri_detokenize": (ctypes.c_int, [c_void_p, c_void_p, c_size_t, c_uint32, _P(c_void_p), _P(c_size_t)]),
    "colibri_free_text": (None, [c_void_p]),
    "colibri_inference_params_default": (InferenceParams, []),
    "colibri_finish_reason_name": (c_char_p, [ctypes.c_int]),
    "colibri_inference": (ctypes.c_int, [c_void_p, c_char_p, _P(InferenceParams), _P(_P(Result))]),
    "colibri_inference_tokens": (ctypes.c_int, [c_void_p, c_void_p, c_size_t, _P(InferenceParams), _P(_P(Result))]),
    "colibri_free_result": (None, [_P(Result)]),
    "colibri_router_config_default": (RouterConfig, []),
    "colibri_init": (ctypes.c_int, [c_int32, c_int32, _P(c_void_p)]),
    "colibri_init_with_config": (ctypes.c_int, [_P(RouterConfig), _P(c_void_p)]),
    "colibri_router_get_config": (ctypes.c_int, [c_void_p, _P(RouterConfig)]),
    "colibri_route_experts": (ctypes.c_int, [c_void_p, c_void_p, c_void_p, c_void_p]),
    "colibri_route_batch_experts": (ctypes.c_int, [c_void_p, c_void_p, c_size_t, c_void_p, c_void_p]),
    "colibri_set_cache_policy": (ctypes.c_int, [c_void_p, ctypes.c_int]),
    "colibri_model_set_cache_policy": (ctypes.c_int, [c_void_p, ctypes.c_int]),
    "colibri_free": (None, [c_void_p]),
}

class LibraryVersionError(OSError):
    """libcolibri.so and this binding come from different colibri versions
    (another ABI, a missing function or another struct layout)."""


# The _default() function of each versioned struct the binding fills in.
_DEFAULTS = {
    LoadOptions: "colibri_load_options_default",
    ExpertCacheOptions: "colibri_expert_cache_options_default",
    InferenceParams: "colibri_inference_params_default",
    RouterConfig: "colibri_router_config_default",
}


def default(struct: type) -> ctypes.Structure:
    """The library's defaults for `struct`, refused unless the library's
    struct is exactly this binding's. The library accepts a few older, shorter
    layouts, but then ignores the fields it lacks; and a longer one would make
    it read past the Python struct. The binding and the library are built
    together, so any difference means they do not match."""
    name = _DEFAULTS[struct]
    value = getattr(lib(), name)()
    size = ctypes.sizeof(struct)
    if value.struct_size != size:
        raise LibraryVersionError(
            f"{name}() of {_path} reports struct_size {value.struct_size} but this binding's {struct.__name__} is "
            f"{size} bytes: the library and the Python binding are from different colibri versions (use the "
            f"binding built with the library)"
        )
    value.struct_size = size
    return value


_lock = threading.Lock()
_lib: ctypes.CDLL | None = None
_path: str | None = None


def _candidates() -> list[pathlib.Path]:
    found: list[pathlib.Path] = []
    build_dir = os.environ.get("COLIBRI_BUILD_DIR")
    if build_dir:
        found.append(pathlib.Path(build_dir) / "lib" / "libcolibri.so")
    repo = pathlib.Path(__file__).resolve().parents[3]
    builds = sorted(repo.glob("build*/lib/libcolibri.so"), key=lambda p: p.stat().st_mtime, reverse=True)
    found.extend(builds)
    return found


def library_path() -> str:
    """The path of the libcolibri.so this process uses (loading it if needed)."""
    lib()
    assert _path is not None
    return _path


def lib() -> ctypes.CDLL:
    """libcolibri, loaded and declared on first use."""
    global _lib, _path
    if _lib is not None:
        return _lib
    with _lock:
        if _lib is not None:
            return _lib
        explicit = os.environ.get("COLIBRI_LIBRARY")
        if explicit:
            if not os.path.exists(explicit):
                raise OSError(f"COLIBRI_LIBRARY={explicit} does not exist")
            path = explicit
        else:
            tried = _candidates()
            existing = [p for p in tried if p.exists()]
            if existing:
                path = str(existing[0])
            else:
                system = ctypes.util.find_library("colibri")
                if system is None:
                    raise OSError(
                        "libcolibri.so not found: set COLIBRI_LIBRARY to its path or COLIBRI_BUILD_DIR to a "
                        "build directory (tried: " + ", ".join(str(p) for p in tried) + ", and the system path)"
                    )
                path = system
        handle = ctypes.CDLL(path)
        for name, (restype, argtypes) in _PROTOTYPES.items():
            try:
                function = getattr(handle, name)
            except AttributeError:
                # A bare AttributeError would not say which library or why.
                raise LibraryVersionError(
                    f"{path} has no function {name}: the library is older than this Python binding (use the "
                    f"library built with the binding, e.g. rebuild it, or point COLIBRI_LIBRARY at a newer one)"
                ) from None
            function.restype = restype
            function.argtypes = argtypes
        abi = handle.colibri_abi_version()
        if abi != ABI_VERSION:
            raise LibraryVersionError(f"{path} implements colibri ABI {abi}; this package needs {ABI_VERSION}")
        _path = path
        _lib = handle
        return handle
