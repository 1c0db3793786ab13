"""Unit tests of ``tests.helpers.assert_same``, the comparison every equivalence test relies on."""

from __future__ import annotations

import numpy as np
import pytest
from gymnasium import spaces

from tests.helpers import assert_same


@pytest.mark.parametrize(
    "got, want",
    [
        (np.array([np.nan, 1.0]), np.array([np.nan, 1.0])),
        (np.float32("nan"), np.float32("nan")),
        (float("nan"), float("nan")),
        ({"a": 1, "b": (2, [3.0])}, {"a": 1, "b": (2, [3.0])}),
        (np.array([{"x": np.zeros(2)}, None], dtype=object), np.array([{"x": np.zeros(2)}, None], dtype=object)),
        (spaces.GraphInstance(np.zeros(2), None, None), spaces.GraphInstance(np.zeros(2), None, None)),
    ],
    ids=["nan array", "nan numpy scalar", "nan float", "nested", "object array", "named tuple"],
)
def test_assert_same_accepts_identical_values(got, want):
    assert_same(got, want)


@pytest.mark.parametrize(
    "got, want, message",
    [
        ({"b": 1, "a": 2}, {"a": 2, "b": 1}, "value: keys ['b', 'a'] != ['a', 'b']"),
        ([1, 2], (1, 2), "value: type list != tuple"),
        (np.int64(1), 1, "value: type int64 != int"),
        (np.zeros(2, np.float32), np.zeros(2, np.float64), "value: float32(2,) != float64(2,)"),
        (np.zeros((1, 2)), np.zeros(2), "value: float64(1, 2) != float64(2,)"),
        (np.array([-0.0]), np.array([0.0]), "value: values differ"),
        (-0.0, 0.0, "value: -0.0 != 0.0"),
        (np.array([np.nan, 1.0]), np.array([1.0, np.nan]), "value: values differ"),
        (np.array([1, None], dtype=object), np.array([1, 2], dtype=object), "value.flat[1]: type NoneType != int"),
        (
            spaces.GraphInstance(np.zeros(2), None, None),
            (np.zeros(2), None, None),
            "value: type GraphInstance != tuple",
        ),
        ({"a": [1, {"b": 2.5}]}, {"a": [1, {"b": 2.0}]}, "value['a'][1]['b']: 2.5 != 2.0"),
    ],
    ids=[
        "key order",
        "list vs tuple",
        "numpy vs python scalar",
        "dtype",
        "shape",
        "negative zero in array",
        "negative zero",
        "nan position",
        "object array",
        "named tuple class",
        "nested path",
    ],
)
def test_assert_same_refuses_any_difference(got, want, message):
    with pytest.raises(AssertionError) as excinfo:
        assert_same(got, want)
    assert str(excinfo.value).startswith(message)
