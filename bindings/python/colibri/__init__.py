"""Python binding of libcolibri (ctypes only, no compiled extension).

    import colibri
    model = colibri.Model("tests/data/fixtures/mixtral-tiny")
    result = model.generate("The capital of France is", max_tokens=16)
    print(result.text, result.tokens, result.finish_reason)

    router = colibri.Router(num_experts=64, top_k=8, normalize=True)
    experts, weights = router.route(gate_logits)   # [n, 64] -> [n, 8], [n, 8]

Zero copy:
  * Result.tokens and Model.tokenize() are numpy arrays over the library's own
    buffers (numpy.ctypeslib.as_array); each array keeps the object that owns
    the buffer alive, and the buffer is freed only when the last array (or
    view) over it is gone.
  * Router.route() passes float32, C-contiguous CPU input to the library as
    is: numpy arrays directly, and any DLPack producer (``__dlpack__``, e.g. a
    torch tensor) through ``numpy.from_dlpack``. Other dtypes or layouts are
    converted (a copy) unless ``copy=False`` is given, which raises instead.

The library is found through COLIBRI_LIBRARY, COLIBRI_BUILD_DIR or the
repository's build directory (see colibri._ffi).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import threading
from dataclasses import dataclass
from typing import Callable, Iterable, Optional, Sequence, Tuple, Union

import numpy as np

from . import _ffi

__all__ = [
    "ColibriError",
    "InvalidArgumentError",
    "NullPointerError",
    "LoadError",
    "OutOfRangeError",
    "ContextFullError",
    "UnsupportedError",
    "OutOfMemoryError",
    "InternalError",
    "LibraryVersionError",
    "Model",
    "ModelInfo",
    "Result",
    "Router",
    "as_logits",
    "kernels",
    "library_path",
    "version",
    "CACHE_LRU",
    "CACHE_LFU",
    "CACHE_FIFO",
]

CACHE_LRU = _ffi.CACHE_LRU
CACHE_LFU = _ffi.CACHE_LFU
CACHE_FIFO = _ffi.CACHE_FIFO

_KDL_CPU = 1  # DLPack device type of host memory


# ----------------------------------------------------------------------------- errors


class ColibriError(Exception):
    """A status other than COLIBRI_OK. ``status`` is the code, ``message`` the
    library's colibri_last_error() text."""

    def __init__(self, status: int, message: str):
        self.status = status
        self.message = message
        name = _ffi.lib().colibri_status_name(status).decode()
        self.status_name = name
        super().__init__(f"{name}: {message}")


class InvalidArgumentError(ColibriError, ValueError):
    pass


class NullPointerError(ColibriError, ValueError):
    pass


class LoadError(ColibriError, OSError):
    pass


class OutOfRangeError(ColibriError, ValueError):
    pass


class ContextFullError(ColibriError, ValueError):
    pass


class UnsupportedError(ColibriError, NotImplementedError):
    pass


class OutOfMemoryError(ColibriError, MemoryError):
    pass


class InternalError(ColibriError, RuntimeError):
    pass


LibraryVersionError = _ffi.LibraryVersionError

_ERRORS = {
    _ffi.ERR_INVALID_ARGUMENT: InvalidArgumentError,
    _ffi.ERR_NULL_POINTER: NullPointerError,
    _ffi.ERR_LOAD: LoadError,
    _ffi.ERR_OUT_OF_RANGE: OutOfRangeError,
    _ffi.ERR_CONTEXT_FULL: ContextFullError,
    _ffi.ERR_UNSUPPORTED: UnsupportedError,
    _ffi.ERR_OUT_OF_MEMORY: OutOfMemoryError,
    _ffi.ERR_INTERNAL: InternalError,
}


def _check(status: int) -> None:
    if status != _ffi.OK:
        message = _ffi.lib().colibri_last_error().decode("utf-8", errors="replace")
        raise _ERRORS.get(status, ColibriError)(status, message)


def library_path() -> str:
    """Path of the libcolibri.so in use."""
    return _ffi.library_path()


def version() -> str:
    return _ffi.lib().colibri_version().decode()


def kernels() -> str:
    """The instruction-set path the kernels run on: "amx", "avx512", "avx2",
    "neon" or "scalar" (the best this CPU has; COLIBRI_ISA caps it)."""
    return _ffi.lib().colibri_kernels().decode()


# ----------------------------------------------------------------------------- zero-copy buffers


class _LibraryBuffer:
    """Owns what the library allocated (`handle`, released by `free(handle)`)
    at `address`; numpy arrays over it keep this object, so it is released
    when the last of them is gone."""

    __slots__ = ("address", "_handle", "_free", "__weakref__")

    def __init__(self, address: int, handle, free: Callable):
        self.address = address
        self._handle = handle
        self._free = free

    def __del__(self):
        free, self._free = self._free, None
        if free is not None and self._handle:
            free(self._handle)


def _array_over(address: int, count: int, ctype, owner) -> np.ndarray:
    """A numpy array over `count` values at `address` without copying; the
    array's base keeps `owner` (and so the buffer) alive."""
    carray = (ctype * count).from_address(address)
    carray._colibri_owner = owner  # ctypes array -> owner; numpy's base -> ctypes array
    return np.ctypeslib.as_array(carray)


def buffer_owner(array: np.ndarray):
    """The object owning the library buffer under `array` (None for arrays
    that are not over a library buffer). For tests and debugging."""
    base = array
    while base is not None:
        owner = getattr(base, "_colibri_owner", None)
        if owner is not None:
            return owner
        if isinstance(base, memoryview):
            base = base.obj
        else:
            base = getattr(base, "base", None)
    return None


def _int32_ids(tokens, what: str) -> np.ndarray:
    """`tokens` as a C-contiguous int32 array (no copy for one already), with
    values outside int32 rejected instead of wrapped."""
    array = np.asarray(tokens)
    if array.ndim != 1:
        raise ValueError(f"{what} must be one-dimensional, got shape {array.shape}")
    if array.size and not np.issubdtype(array.dtype, np.integer):
        raise TypeError(f"{what} must be integers, got {array.dtype}")
    if array.dtype != np.int32:
        if array.size and (array.min() < -(2**31) or array.max() >= 2**31):
            raise OutOfRangeError(_ffi.ERR_OUT_OF_RANGE, f"{what} holds an id outside int32")
        array = array.astype(np.int32)
    return np.ascontiguousarray(array)


# ----------------------------------------------------------------------------- models


@dataclass(frozen=True)
class ModelInfo:
    arch: str
    arch_name: str
    weight_scheme: str
    path: str
    n_layers: int
    n_moe_layers: int
    hidden: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    vocab: int
    n_experts: int
    top_k: int
    norm_top_k: bool
    expert_ff: int
    shared_ff: int
    max_positions: int
    bos_token_id: Optional[int]
    eos_token_id: Optional[int]
    weight_bytes: int


class Result:
    """One generation. ``tokens`` is a zero-copy int32 array over the
    library's colibri_result; that result is freed (colibri_free_result) when
    this object and every array or view over its tokens are gone."""

    def __init__(self, pointer):
        r = pointer.contents
        self.tokens_address: int = ctypes.cast(r.tokens, ctypes.c_void_p).value or 0
        self._owner = _LibraryBuffer(self.tokens_address, pointer, _ffi.lib().colibri_free_result)
        self.n_prompt_tokens: int = r.n_prompt_tokens
        self.finish_reason: str = _ffi.FINISH_REASONS.get(r.finish_reason, "unknown")
        self.text_bytes: bytes = ctypes.string_at(r.text, r.text_len) if r.text_len else b""
        self.text: str = self.text_bytes.decode("utf-8", errors="replace")
        self.tokens: np.ndarray = _array_over(self.tokens_address, r.n_tokens, ctypes.c_int32, self._owner)
        # With generate(logprobs=N): each token's log-probability under the
        # model's own distribution, and the N most likely (token, logprob) pairs
        # at its position (copies: small, and independent of the result).
        self.logprobs: Optional[np.ndarray] = None
        self.top_logprobs: Optional[list] = None
        if r.token_logprobs:
            n, width = r.n_tokens, r.n_top_logprobs
            self.logprobs = np.ctypeslib.as_array(r.token_logprobs, shape=(max(n, 1),))[:n].copy()
            self.top_logprobs = [
                [(r.top_logprobs[i * width + k].token, float(r.top_logprobs[i * width + k].logprob))
                 for k in range(width) if r.top_logprobs[i * width + k].token >= 0]
                for i in range(n)]

    def __repr__(self):
        return f"Result(tokens={len(self.tokens)}, finish_reason={self.finish_reason!r}, text={self.text!r})"


class Model:
    """A loaded model (a .colibri file, a GGUF file or a Hugging Face
    directory).

    Safe to use from several threads at once: generate(), tokenize(),
    detokenize(), info, expert_cache_stats() and set_cache_policy() run
    concurrently (generations one at a time once an expert cache is enabled).
    close() and enable_expert_cache() wait for the calls in progress, and hold
    new ones back until they are done; calls after close() raise ValueError.
    An on_text callback may call the model's other methods, and generate()
    when it has no expert cache; close(), enable_expert_cache(), and generate()
    with an expert cache would wait for the generation the callback is part of,
    so from a callback they raise RuntimeError instead of deadlocking."""

    # colibri_weights_memory in colibri.h
    _WEIGHTS = {"map": 0, "copy": 1, "auto": 2}

    def __init__(self, path: Union[str, "os.PathLike[str]"], *, verify_checksums: bool = False,
                 weights: str = "map"):
        """weights: how a .colibri file's weights are held. "map" (default):
        the page cache's pages, instant and shared, and what an expert cache
        needs; "copy": read into huge-page memory at load, decode about 1.5x
        faster; "auto": copy when it fits in available memory with a tenth to
        spare."""
        self._handle = None
        # Shared use (every call) against exclusive use (close,
        # enable_expert_cache): the library frees or swaps what running calls use.
        self._state = threading.Condition(threading.Lock())
        self._users = 0  # calls in progress
        self._exclusive_waiting = 0
        self._exclusive = False
        self._thread = threading.local()  # .depth: this thread's calls in progress; .generating: its generations
        self._expert_cache = False
        lib = _ffi.lib()
        if weights not in self._WEIGHTS:
            raise ValueError(f"weights must be one of {sorted(self._WEIGHTS)}, got {weights!r}")
        options = _ffi.default(_ffi.LoadOptions)
        options.verify_checksums = 1 if verify_checksums else 0
        handle = ctypes.c_void_p()
        # fsencode: a path that is not valid UTF-8 (surrogate-escaped) keeps its bytes.
        _check(lib.colibri_load_model_with_memory(os.fsencode(path), ctypes.byref(options),
                                                  self._WEIGHTS[weights], ctypes.byref(handle)))
        self._handle = handle
        self._info: Optional[ModelInfo] = None

    # -- lifetime
    def close(self) -> None:
        """Unloads the model (also done when it is garbage-collected), after
        the calls in progress on other threads return; later calls raise
        ValueError. Results and token arrays from it stay valid. Raises
        RuntimeError from an on_text callback of this model."""
        with self._exclusive_use("close()"):
            handle, self._handle = self._handle, None
            if handle:
                _ffi.lib().colibri_unload_model(handle)

    def __del__(self):
        # No other reference, so no call in progress: no need to wait.
        handle, self._handle = getattr(self, "_handle", None), None
        if handle:
            _ffi.lib().colibri_unload_model(handle)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    @contextlib.contextmanager
    def _use(self):
        """The handle, kept loaded (and its expert cache unchanged) until the
        block ends."""
        local = self._thread
        depth = getattr(local, "depth", 0)
        with self._state:
            # A call nested in a callback must not queue behind a waiting
            # close(): that one waits for the call the callback is part of.
            while self._exclusive or (self._exclusive_waiting and depth == 0):
                self._state.wait()
            if not self._handle:
                raise ValueError("the model is closed")
            self._users += 1
        local.depth = depth + 1
        try:
            yield self._handle
        finally:
            local.depth = depth
            with self._state:
                self._users -= 1
                if self._users == 0:
                    self._state.notify_all()

    @contextlib.contextmanager
    def _exclusive_use(self, what: str):
        """No other call on the model runs until the block ends."""
        if getattr(self._thread, "depth", 0):
            raise RuntimeError(
                f"{what} was called from inside a call on the same model (an on_text callback): it waits for "
                f"the calls in progress, that one included, so it would never return"
            )
        with self._state:
            self._exclusive_waiting += 1
            try:
                while self._users or self._exclusive:
                    self._state.wait()
            finally:
                self._exclusive_waiting -= 1
            self._exclusive = True
        try:
            yield
        finally:
            with self._state:
                self._exclusive = False
                self._state.notify_all()

    # -- info
    @property
    def info(self) -> ModelInfo:
        if self._info is None:
            stats = _ffi.ModelStats()
            stats.struct_size = ctypes.sizeof(_ffi.ModelStats)
            with self._use() as handle:
                _check(_ffi.lib().colibri_model_info(handle, ctypes.byref(stats)))
                path = os.fsdecode(stats.path)  # the path may not be UTF-8; it is the caller's bytes
            self._info = ModelInfo(
                arch=stats.arch.decode(),
                arch_name=stats.arch_name.decode(),
                weight_scheme=stats.weight_scheme.decode(),
                path=path,
                n_layers=stats.n_layers,
                n_moe_layers=stats.n_moe_layers,
                hidden=stats.hidden,
                n_heads=stats.n_heads,
                n_kv_heads=stats.n_kv_heads,
                head_dim=stats.head_dim,
                vocab=stats.vocab,
                n_experts=stats.n_experts,
                top_k=stats.top_k,
                norm_top_k=bool(stats.norm_top_k),
                expert_ff=stats.expert_ff,
                shared_ff=stats.shared_ff,
                max_positions=stats.max_positions,
                bos_token_id=None if stats.bos_token_id < 0 else stats.bos_token_id,
                eos_token_id=None if stats.eos_token_id < 0 else stats.eos_token_id,
                weight_bytes=stats.weight_bytes,
            )
        return self._info

    # -- tokenizer
    def tokenize(self, text: str, *, add_special: bool = True, parse_special: bool = False) -> np.ndarray:
        """Token ids of `text` as an int32 array over the library's buffer."""
        lib = _ffi.lib()
        flags = (_ffi.TOKENIZE_ADD_SPECIAL if add_special else 0) | (
            _ffi.TOKENIZE_PARSE_SPECIAL if parse_special else 0
        )
        pointer = ctypes.c_void_p()
        count = ctypes.c_size_t()
        data = _encode_text(text)
        with self._use() as handle:
            _check(lib.colibri_tokenize(handle, data, flags, ctypes.byref(pointer), ctypes.byref(count)))
        owner = _LibraryBuffer(pointer.value, pointer.value, lib.colibri_free_tokens)
        return _array_over(pointer.value, count.value, ctypes.c_int32, owner)

    def detokenize(self, tokens, *, skip_special: bool = False) -> str:
        """Text of `tokens` (any int sequence; an int32 array is not copied)."""
        return self.detokenize_bytes(tokens, skip_special=skip_special).decode("utf-8", errors="replace")

    def detokenize_bytes(self, tokens, *, skip_special: bool = False) -> bytes:
        lib = _ffi.lib()
        ids = _int32_ids(tokens, "tokens")
        text = ctypes.c_void_p()
        length = ctypes.c_size_t()
        flags = _ffi.DETOKENIZE_SKIP_SPECIAL if skip_special else 0
        with self._use() as handle:
            _check(lib.colibri_detokenize(handle, ids.ctypes.data, ids.size, flags, ctypes.byref(text),
                                          ctypes.byref(length)))
        try:
            return ctypes.string_at(text.value, length.value)
        finally:
            lib.colibri_free_text(text)

    # -- generation
    def generate(
        self,
        prompt: Union[str, Sequence[int], np.ndarray],
        *,
        max_tokens: int = 128,
        temperature: float = 0.0,
        top_k: int = 0,
        top_p: float = 1.0,
        min_p: float = 0.0,
        repetition_penalty: float = 1.0,
        presence_penalty: float = 0.0,
        frequency_penalty: float = 0.0,
        penalty_last_n: int = 64,
        seed: int = 0,
        stop: Iterable[str] = (),
        ignore_eos: bool = False,
        n_ctx: int = 0,
        add_special: bool = True,
        parse_special: bool = False,
        on_text: Optional[Callable[[str], Optional[bool]]] = None,
        logit_bias: Optional[dict] = None,
        logprobs: Optional[int] = None,
        json_object: bool = False,
        exact_prompt: bool = False,
    ) -> Result:
        """Generates from a text prompt or from prompt token ids. Defaults are
        greedy decoding (temperature 0), as colibri-run. `on_text` receives each
        piece of text as it completes; returning False cancels. `logit_bias`
        maps token ids to biases in [-100, 100] added to their logits.
        `logprobs=N` (0-20) fills Result.logprobs and Result.top_logprobs.
        `json_object=True` constrains the text to one JSON object; generation
        ends when it closes (finish_reason "json_complete"). `exact_prompt=True`
        multiplies the prompt as generated tokens are (two int8 activation
        planes on 8-bit weights), so its logits are bit-identical to decoding it
        token by token; by default its attention-output and FFN gate and up
        products take one plane, as colibri-run and the server do
        (docs/KERNELS.md, "Prefill modes")."""
        lib = _ffi.lib()
        params = _ffi.default(_ffi.InferenceParams)
        _set_int(params, "max_tokens", max_tokens)
        _set_int(params, "n_ctx", n_ctx)
        params.temperature = temperature
        _set_int(params, "top_k", top_k)
        params.top_p = top_p
        params.min_p = min_p
        params.repetition_penalty = repetition_penalty
        params.presence_penalty = presence_penalty
        params.frequency_penalty = frequency_penalty
        _set_int(params, "penalty_last_n", penalty_last_n)
        if not 0 <= seed < 2**64:
            raise InvalidArgumentError(_ffi.ERR_INVALID_ARGUMENT, f"seed must be in [0, 2**64), got {seed}")
        params.seed = seed
        params.ignore_eos = 1 if ignore_eos else 0
        params.add_special_tokens = 1 if add_special else 0
        params.parse_special = 1 if parse_special else 0

        if isinstance(stop, (str, bytes)):
            stop = [stop]
        encoded = [s.encode() if isinstance(s, str) else bytes(s) for s in stop]
        for i, data in enumerate(encoded):
            # C reads a stop string up to its first NUL: "a\0b" would stop at "a".
            if b"\0" in data:
                raise InvalidArgumentError(_ffi.ERR_INVALID_ARGUMENT, f"stop[{i}] contains a NUL character")
        stop_array = (ctypes.c_char_p * max(len(encoded), 1))(*encoded)
        if encoded:
            params.stop = ctypes.cast(stop_array, ctypes.POINTER(ctypes.c_char_p))
            params.n_stop = len(encoded)

        bias_ids = bias_values = None
        if logit_bias:
            bias_ids = _int32_ids(list(logit_bias.keys()), "logit_bias")
            bias_values = np.ascontiguousarray([float(v) for v in logit_bias.values()], dtype=np.float32)
            params.logit_bias_tokens = bias_ids.ctypes.data_as(ctypes.POINTER(ctypes.c_int32))
            params.logit_bias_values = bias_values.ctypes.data_as(ctypes.POINTER(ctypes.c_float))
            params.n_logit_bias = bias_ids.size
        if logprobs is not None:
            _set_int(params, "logprobs", logprobs)
        params.json_object = 1 if json_object else 0
        params.exact_prompt = 1 if exact_prompt else 0

        failure: list = []
        callback = None
        if on_text is not None:

            def trampoline(text, length, _user):
                try:
                    piece = ctypes.string_at(text, length).decode("utf-8", errors="replace")
                    return 0 if on_text(piece) is False else 1
                except BaseException as exc:  # noqa: BLE001 - re-raised after the call
                    failure.append(exc)
                    return 0

            callback = _ffi.TEXT_CALLBACK(trampoline)
            params.on_text = callback

        out = ctypes.POINTER(_ffi.Result)()
        text = _encode_text(prompt) if isinstance(prompt, str) else None
        ids = None if isinstance(prompt, str) else _int32_ids(prompt, "prompt")
        local = self._thread
        generating = getattr(local, "generating", 0)
        with self._use() as handle:
            # With an expert cache a generation holds the model's (non-recursive)
            # store mutex until it returns, so a nested one would deadlock.
            if generating and self._expert_cache:
                raise RuntimeError(
                    "generate() was called from an on_text callback of a generation on the same model, which has "
                    "an expert cache: its generations run one at a time, so this one would wait forever for the "
                    "outer one (generate after it returns, or use another Model)"
                )
            local.generating = generating + 1
            try:
                if text is not None:
                    status = lib.colibri_inference(handle, text, ctypes.byref(params), ctypes.byref(out))
                else:
                    status = lib.colibri_inference_tokens(
                        handle, ids.ctypes.data, ids.size, ctypes.byref(params), ctypes.byref(out)
                    )
            finally:
                local.generating = generating
        result = Result(out) if status == _ffi.OK else None
        if failure:
            raise failure[0]
        _check(status)
        return result

    # colibri_cache_io and colibri_cache_preload in colibri.h; prefetch as the
    # integer field documents.
    _CACHE_IO = {"pread-direct": 0, "pread": 1, "mmap": 2}
    _CACHE_PREFETCH = {"off": 0, "on": 1, "next": 2}
    _CACHE_PRELOAD = {"auto": 0, "on": 1, "off": 2}

    def enable_expert_cache(self, budget_mb: int, *, policy: int = CACHE_LRU, io: str = "pread-direct",
                            prefetch: str = "off", pinned: Optional[str] = None, preload: str = "auto") -> None:
        """Bounds the memory of the model's routed experts to budget_mb MiB
        (docs/EXPERT_STORE.md): experts are read from the .colibri file when
        a token needs them, with exactly the same results. The model must be
        a .colibri file loaded with weights="map" (the default). policy:
        CACHE_LRU, CACHE_LFU or CACHE_FIFO; io: "pread-direct", "pread" or
        "mmap"; prefetch: "off", "on" or "next"; pinned: "layer:expert,..."
        never evicted; preload: "auto" (read every expert now when the budget
        holds them all), "on" (fill the budget now) or "off". Inferences on
        this model then run one at a time. Waits for the calls in progress on
        the model; raises RuntimeError from one of its on_text callbacks.
        Raises LoadError when the budget is below one layer's top-k experts
        (the message gives the minimum)."""
        for value, table, name in ((io, self._CACHE_IO, "io"), (prefetch, self._CACHE_PREFETCH, "prefetch"),
                                   (preload, self._CACHE_PRELOAD, "preload")):
            if value not in table:
                raise ValueError(f"{name} must be one of {sorted(table)}, got {value!r}")
        lib = _ffi.lib()
        options = _ffi.default(_ffi.ExpertCacheOptions)
        options.budget_mb = _in_range(budget_mb, "budget_mb", 0, 2**64)
        options.policy = _int32(policy, "policy")
        options.io = self._CACHE_IO[io]
        options.prefetch = self._CACHE_PREFETCH[prefetch]
        if pinned and "\0" in pinned:
            raise InvalidArgumentError(_ffi.ERR_INVALID_ARGUMENT, "pinned contains a NUL character")
        options.pinned_experts = pinned.encode() if pinned else None
        options.preload = self._CACHE_PRELOAD[preload]
        with self._exclusive_use("enable_expert_cache()"):
            if not self._handle:
                raise ValueError("the model is closed")
            _check(lib.colibri_model_enable_expert_cache(self._handle, ctypes.byref(options)))
            self._expert_cache = True

    def expert_cache_stats(self) -> dict:
        """The expert cache's counters so far (all 0 without one): budget
        bytes, hits, misses, bytes read (the preload's included), seconds
        inference waited for reads, and the preload's bytes and seconds."""
        stats = _ffi.ModelStats()
        stats.struct_size = ctypes.sizeof(_ffi.ModelStats)
        with self._use() as handle:
            _check(_ffi.lib().colibri_model_info(handle, ctypes.byref(stats)))
        return {
            "budget_bytes": stats.expert_cache_bytes,
            "hits": stats.expert_cache_hits,
            "misses": stats.expert_cache_misses,
            "bytes_read": stats.expert_cache_bytes_read,
            "stall_seconds": stats.expert_cache_stall_ns * 1e-9,
            "preload_bytes": stats.expert_cache_preload_bytes,
            "preload_seconds": stats.expert_cache_preload_ns * 1e-9,
        }

    def set_cache_policy(self, policy: int) -> None:
        """Changes the expert cache's eviction policy (CACHE_LRU, CACHE_LFU,
        CACHE_FIFO) from its next eviction. Raises UnsupportedError when the
        model has no expert cache (enable_expert_cache)."""
        policy = _int32(policy, "policy")
        with self._use() as handle:
            _check(_ffi.lib().colibri_model_set_cache_policy(handle, policy))


def _encode_text(text: str) -> bytes:
    if not isinstance(text, str):
        raise TypeError(f"expected str, got {type(text).__name__}")
    data = text.encode("utf-8")
    if b"\0" in data:
        raise InvalidArgumentError(_ffi.ERR_INVALID_ARGUMENT, "text contains a NUL character")
    return data


def _set_int(params, field: str, value: int) -> None:
    setattr(params, field, _int32(value, field))


# ----------------------------------------------------------------------------- routing


def as_logits(x, copy: Optional[bool] = None) -> np.ndarray:
    """`x` as a float32, C-contiguous numpy array over the same memory when
    possible: numpy arrays as they are, DLPack producers (``__dlpack__``) on the
    CPU through numpy.from_dlpack, anything else through numpy.asarray.
    copy=None converts when needed; copy=False raises instead of copying."""
    if isinstance(x, np.ndarray):
        array = x
    elif hasattr(x, "__dlpack__"):
        if hasattr(x, "__dlpack_device__"):
            device_type, device_id = x.__dlpack_device__()
            if int(device_type) != _KDL_CPU:
                raise ValueError(
                    f"the tensor is on DLPack device {int(device_type)}:{device_id}, not the CPU; move it to the "
                    "CPU first (routing reads host memory)"
                )
        try:
            array = np.from_dlpack(x)
        except (RuntimeError, BufferError, TypeError) as exc:
            raise TypeError(f"cannot read {type(x).__name__} through DLPack: {exc}") from exc
    else:
        if copy is False:
            raise ValueError(f"{type(x).__name__} is not an array or a DLPack producer; copy=False forbids converting it")
        array = np.asarray(x)
    if array.dtype == np.float32 and array.flags.c_contiguous:
        return array
    if copy is False:
        raise ValueError(
            f"logits must be float32 and C-contiguous to be used without a copy (got {array.dtype}, "
            f"{'C-contiguous' if array.flags.c_contiguous else 'strided'}); pass copy=None to convert"
        )
    return np.ascontiguousarray(array, dtype=np.float32)


class Router:
    """The engine's router: softmax over `num_experts` gate logits, the top_k
    experts (descending probability, ties to the lower index) and their weights,
    renormalised to sum to 1 when `normalize`. Use one router per thread."""

    def __init__(self, num_experts: int, top_k: int, *, normalize: bool = False):
        lib = _ffi.lib()
        self._handle = None
        handle = ctypes.c_void_p()
        if not normalize:
            _check(lib.colibri_init(_int32(num_experts, "num_experts"), _int32(top_k, "top_k"), ctypes.byref(handle)))
        else:
            config = _ffi.default(_ffi.RouterConfig)
            config.num_experts = _int32(num_experts, "num_experts")
            config.top_k = _int32(top_k, "top_k")
            config.normalize = 1
            _check(lib.colibri_init_with_config(ctypes.byref(config), ctypes.byref(handle)))
        self._handle = handle
        config = _ffi.default(_ffi.RouterConfig)
        _check(lib.colibri_router_get_config(handle, ctypes.byref(config)))
        self.num_experts: int = config.num_experts
        self.top_k: int = config.top_k
        self.normalize: bool = bool(config.normalize)
        self.last_input_address: int = 0  # address the last route() handed to the library
        self._route_one = lib.colibri_route_experts
        self._route_batch = lib.colibri_route_batch_experts

    def close(self) -> None:
        handle, self._handle = getattr(self, "_handle", None), None
        if handle:
            _ffi.lib().colibri_free(handle)

    def __del__(self):
        self.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def route(
        self, logits, *, out: Optional[Tuple[np.ndarray, np.ndarray]] = None, copy: Optional[bool] = None
    ) -> Tuple[np.ndarray, np.ndarray]:
        """Routes one token (logits shape [num_experts]) or a batch ([n,
        num_experts]); returns (experts int32, weights float32) of shape [top_k]
        or [n, top_k]. `logits` may be a numpy array or any CPU DLPack producer
        (read in place when float32 and C-contiguous). `out` may supply the two
        output arrays (C-contiguous, writable, right dtype and shape)."""
        if not self._handle:
            raise ValueError("the router is closed")
        array = as_logits(logits, copy=copy)
        if array.ndim not in (1, 2) or array.shape[-1] != self.num_experts:
            raise InvalidArgumentError(
                _ffi.ERR_INVALID_ARGUMENT,
                f"logits must have shape [{self.num_experts}] or [n, {self.num_experts}] (num_experts), "
                f"got {list(array.shape)}",
            )
        shape = (self.top_k,) if array.ndim == 1 else (array.shape[0], self.top_k)
        if out is None:
            experts = np.empty(shape, dtype=np.int32)
            weights = np.empty(shape, dtype=np.float32)
        else:
            experts, weights = out
            _check_output(experts, np.int32, shape, "experts")
            _check_output(weights, np.float32, shape, "weights")
        address = array.ctypes.data
        self.last_input_address = address
        if array.ndim == 1:
            _check(self._route_one(self._handle, address, experts.ctypes.data, weights.ctypes.data))
        else:
            _check(self._route_batch(self._handle, address, array.shape[0], experts.ctypes.data, weights.ctypes.data))
        return experts, weights

    def set_cache_policy(self, policy: int) -> None:
        """Raises UnsupportedError: a router holds no experts, so it has no
        cache (Model.set_cache_policy applies to a model's expert cache)."""
        _check(_ffi.lib().colibri_set_cache_policy(self._handle, _int32(policy, "policy")))


def _in_range(value: int, name: str, low: int, high: int) -> int:
    """int(value), refused outside [low, high): ctypes would wrap it silently."""
    if not low <= int(value) < high:
        def power(n: int) -> str:
            return f"-2**{(-n).bit_length() - 1}" if n < 0 else f"2**{n.bit_length() - 1}" if n else "0"

        raise InvalidArgumentError(
            _ffi.ERR_INVALID_ARGUMENT, f"{name} = {value} is outside the range [{power(low)}, {power(high)}) of the C "
            f"parameter it is passed as")
    return int(value)


def _int32(value: int, name: str) -> int:
    return _in_range(value, name, -(2**31), 2**31)


def _check_output(array, dtype, shape, name: str) -> None:
    if not isinstance(array, np.ndarray):
        raise TypeError(f"out {name} must be a numpy array")
    if array.dtype != dtype or array.shape != shape or not array.flags.c_contiguous or not array.flags.writeable:
        raise ValueError(
            f"out {name} must be a writable C-contiguous {np.dtype(dtype).name} array of shape {list(shape)}, "
            f"got {array.dtype} {list(array.shape)}"
        )
