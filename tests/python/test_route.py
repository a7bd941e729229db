"""Routing through the binding equals the engine's router rule on crafted
logits: softmax over all experts, the top-k by probability (ties to the lower
index), optionally renormalised. (tests/capi checks the library against the
engine's route_top_k bit for bit; here the reference is the same rule in
numpy.)"""

import math

import numpy as np
import pytest

import colibri


def reference_route(logits, top_k, normalize):
    logits = np.asarray(logits, dtype=np.float32)
    shifted = np.exp(logits - logits.max(axis=-1, keepdims=True), dtype=np.float32)
    probabilities = shifted / shifted.sum(axis=-1, keepdims=True, dtype=np.float32)
    order = np.argsort(-probabilities, axis=-1, kind="stable")[..., :top_k]
    weights = np.take_along_axis(probabilities, order, axis=-1)
    if normalize:
        weights = weights / weights.sum(axis=-1, keepdims=True)
    return order.astype(np.int32), weights.astype(np.float32)


LN2 = math.log(2.0)
CRAFTED = [
    ("distinct", [0.1, 2.0, -1.0, 3.0, 0.5, 1.0, -2.0, 0.0], 2, [3, 1]),
    ("all equal: lowest indices", [1.5] * 8, 3, [0, 1, 2]),
    ("tie at the cut", [0.0, 2.0, 1.0, 2.0, 1.0, 1.0, -1.0, 1.0], 3, [1, 3, 2]),
    ("tie at the top", [5.0, -3.0, 5.0, 5.0, 0.0, 0.0, 0.0, 0.0], 2, [0, 2]),
    ("powers of two", [0.0, LN2, 2 * LN2, 3 * LN2, -50.0, -50.0, -50.0, -50.0], 4, [3, 2, 1, 0]),
    ("large magnitudes", [1000.0, -1000.0, 999.0, 0.0, 998.5, -999.0, 1e-3, 1000.0], 4, [0, 7, 2, 4]),
    ("top_k = n", [0.3, 0.2, 0.1, 0.0, -0.1, -0.2, -0.3, 0.4], 8, [7, 0, 1, 2, 3, 4, 5, 6]),
    ("one", [-1.0, -2.0, -0.5, -3.0, -4.0, -0.25, -6.0, -7.0], 1, [5]),
]


@pytest.mark.parametrize("normalize", [False, True])
@pytest.mark.parametrize("name,logits,top_k,expected", CRAFTED, ids=[c[0] for c in CRAFTED])
def test_crafted_logits(name, logits, top_k, expected, normalize):
    router = colibri.Router(len(logits), top_k, normalize=normalize)
    assert (router.num_experts, router.top_k, router.normalize) == (len(logits), top_k, normalize)
    experts, weights = router.route(np.array(logits, dtype=np.float32))
    ref_experts, ref_weights = reference_route(logits, top_k, normalize)
    assert experts.tolist() == expected == ref_experts.tolist()
    np.testing.assert_allclose(weights, ref_weights, rtol=1e-6, atol=1e-7)
    if normalize or top_k == len(logits):
        assert abs(float(weights.sum()) - 1.0) < 1e-6
    # The same row as a batch of one.
    batch_experts, batch_weights = router.route(np.array([logits], dtype=np.float32))
    assert batch_experts.shape == (1, top_k)
    assert batch_experts[0].tolist() == experts.tolist()
    assert batch_weights[0].tobytes() == weights.tobytes()


def test_exact_renormalisation():
    logits = np.array([0.0, LN2, 2 * LN2, 3 * LN2], dtype=np.float32)  # p = 1, 2, 4, 8 / 15
    experts, weights = colibri.Router(4, 2, normalize=True).route(logits)
    assert experts.tolist() == [3, 2]
    np.testing.assert_allclose(weights, [2 / 3, 1 / 3], rtol=1e-6)
    experts, weights = colibri.Router(4, 2).route(logits)
    np.testing.assert_allclose(weights, [8 / 15, 4 / 15], rtol=1e-6)


@pytest.mark.parametrize("normalize", [False, True])
def test_batch_equals_reference_and_single_routes(normalize):
    rng = np.random.default_rng(3)
    logits = rng.normal(0.0, 2.0, size=(1024, 64)).astype(np.float32)
    logits[5] = 0.25  # a row of ties
    router = colibri.Router(64, 8, normalize=normalize)
    experts, weights = router.route(logits)
    assert experts.shape == weights.shape == (1024, 8)
    ref_experts, ref_weights = reference_route(logits, 8, normalize)
    np.testing.assert_array_equal(experts, ref_experts)
    np.testing.assert_allclose(weights, ref_weights, rtol=1e-5, atol=1e-7)
    assert experts[5].tolist() == list(range(8))
    for row in (0, 5, 511, 1023):
        one_experts, one_weights = router.route(logits[row])
        assert one_experts.tolist() == experts[row].tolist()
        assert one_weights.tobytes() == weights[row].tobytes()
    empty_experts, empty_weights = router.route(np.empty((0, 64), dtype=np.float32))
    assert empty_experts.shape == (0, 8)


def test_invalid_arguments_raise():
    with pytest.raises(colibri.InvalidArgumentError, match="top_k"):
        colibri.Router(8, 9)
    with pytest.raises(colibri.InvalidArgumentError, match="top_k"):
        colibri.Router(8, 0, normalize=True)
    with pytest.raises(colibri.InvalidArgumentError, match="num_experts"):
        colibri.Router(0, 1)
    with pytest.raises(colibri.OutOfRangeError, match="num_experts"):
        colibri.Router(65537, 1)
    router = colibri.Router(8, 2)
    with pytest.raises(colibri.InvalidArgumentError, match="num_experts"):
        router.route(np.zeros(7, dtype=np.float32))  # wrong expert count
    with pytest.raises(colibri.InvalidArgumentError):
        router.route(np.zeros((2, 2, 8), dtype=np.float32))
    logits = np.zeros((4, 8), dtype=np.float32)
    logits[2, 6] = np.nan
    with pytest.raises(colibri.InvalidArgumentError, match="token 2.*expert 6"):
        router.route(logits)
    with pytest.raises(colibri.InvalidArgumentError, match="expert 3"):
        router.route(np.array([0, 0, 0, np.inf, 0, 0, 0, 0], dtype=np.float32))
    with pytest.raises(ValueError, match="out experts"):
        router.route(np.zeros(8, dtype=np.float32), out=(np.empty(3, np.int32), np.empty(2, np.float32)))
    for policy in (colibri.CACHE_LRU, colibri.CACHE_LFU, colibri.CACHE_FIFO):
        with pytest.raises(colibri.UnsupportedError, match="no expert store"):
            router.set_cache_policy(policy)
    with pytest.raises(colibri.InvalidArgumentError, match="policy"):
        router.set_cache_policy(9)
