"""Zero copy both ways: library buffers are exposed as numpy arrays without a
copy and stay alive as long as an array over them does; routing input is read
in place from numpy arrays and DLPack producers."""

import gc
import weakref

import numpy as np
import pytest

import colibri


def data_pointer(array):
    return array.__array_interface__["data"][0]


def test_result_tokens_are_the_library_buffer(mixtral):
    result = mixtral.generate("The quick brown fox", max_tokens=12, ignore_eos=True)
    tokens = result.tokens
    assert tokens.dtype == np.int32 and tokens.shape == (12,)
    # The address the library's colibri_result holds, read from the C struct.
    struct_address = colibri._ffi.ctypes.cast(
        result._owner._handle.contents.tokens, colibri._ffi.ctypes.c_void_p).value
    assert data_pointer(tokens) == struct_address == result.tokens_address
    assert colibri.buffer_owner(tokens) is result._owner


def test_result_outlives_its_object_while_an_array_needs_it(mixtral):
    result = mixtral.generate("The quick brown fox", max_tokens=12, ignore_eos=True)
    expected = result.tokens.tolist()
    view = result.tokens[2:]
    owner = weakref.ref(result._owner)
    del result
    gc.collect()
    assert owner() is not None, "freed while a view still points into it"
    assert view.tolist() == expected[2:]
    del view
    gc.collect()
    assert owner() is None, "not freed once nothing points into it"


def test_tokenize_array_is_the_library_buffer(mixtral):
    ids = mixtral.tokenize("hello world, hello experts")
    owner = colibri.buffer_owner(ids)
    assert owner is not None and data_pointer(ids) == owner.address
    alive = weakref.ref(owner)
    expected = ids.tolist()
    del owner
    gc.collect()
    assert alive() is not None and ids.tolist() == expected
    del ids
    gc.collect()
    assert alive() is None


def test_numpy_input_is_not_copied():
    router = colibri.Router(64, 8)
    logits = np.random.default_rng(0).normal(size=(32, 64)).astype(np.float32)
    experts, weights = router.route(logits, copy=False)
    assert router.last_input_address == data_pointer(logits)
    out = (np.empty((32, 8), np.int32), np.empty((32, 8), np.float32))
    got = router.route(logits, out=out)
    assert got[0] is out[0] and got[1] is out[1]
    np.testing.assert_array_equal(out[0], experts)
    # A row of a batch: a view, still no copy.
    router.route(logits[3], copy=False)
    assert router.last_input_address == data_pointer(logits[3])


def test_other_layouts_are_converted_or_refused():
    router = colibri.Router(64, 8)
    logits = np.random.default_rng(1).normal(size=(16, 64))
    expected = router.route(logits.astype(np.float32))
    np.testing.assert_array_equal(router.route(logits)[0], expected[0])  # float64: converted
    with pytest.raises(ValueError, match="copy"):
        router.route(logits, copy=False)
    strided = np.asfortranarray(logits.astype(np.float32))
    np.testing.assert_array_equal(router.route(strided)[0], expected[0])
    with pytest.raises(ValueError, match="C-contiguous"):
        router.route(strided, copy=False)
    np.testing.assert_array_equal(router.route(logits.astype(np.float32).tolist())[0], expected[0])


class DLPackOnly:
    """A producer that offers nothing but the DLPack protocol."""

    def __init__(self, array, device=(1, 0)):
        self._array = array
        self._device = device

    def __dlpack__(self, stream=None):
        return self._array.__dlpack__()

    def __dlpack_device__(self):
        return self._device


def test_dlpack_producer_from_numpy_is_not_copied():
    base = np.random.default_rng(2).normal(size=(8, 64)).astype(np.float32)
    producer = DLPackOnly(base)
    view = colibri.as_logits(producer, copy=False)
    assert data_pointer(view) == data_pointer(base)
    router = colibri.Router(64, 8, normalize=True)
    experts, weights = router.route(producer, copy=False)
    assert router.last_input_address == data_pointer(base)
    expected = router.route(base)
    np.testing.assert_array_equal(experts, expected[0])
    np.testing.assert_array_equal(weights, expected[1])


def test_dlpack_producer_off_the_cpu_is_refused():
    producer = DLPackOnly(np.zeros((2, 64), np.float32), device=(2, 0))  # kDLCUDA
    with pytest.raises(ValueError, match="not the CPU"):
        colibri.Router(64, 8).route(producer)


def test_torch_tensor_is_not_copied():
    torch = pytest.importorskip("torch")  # optional: only where python3-torch is installed
    tensor = torch.randn(128, 64, dtype=torch.float32)
    router = colibri.Router(64, 8)
    experts, weights = router.route(tensor, copy=False)
    assert router.last_input_address == tensor.data_ptr()
    expected = router.route(tensor.numpy())
    np.testing.assert_array_equal(experts, expected[0])
    np.testing.assert_array_equal(weights, expected[1])
    with pytest.raises(TypeError, match="DLPack"):
        router.route(torch.zeros(64, requires_grad=True))
    np.testing.assert_array_equal(router.route(tensor.double())[0], expected[0])  # float64: converted
