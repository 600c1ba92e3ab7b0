"""``borrowed``: a view with no owner reads and writes its array's own memory, of any layout."""

import numpy as np
from numba import njit

from ngramspec.draft.borrowed import borrowed


@njit(cache=False)
def _sum_and_mark(array, row):
    view = borrowed(array)
    total = 0.0
    for i in range(view.shape[0]):
        for j in range(view.shape[1]):
            total += view[i, j]
    view[row, 0] = -1  # through the view, into the caller's array
    return total, view.shape[0], view.shape[1], view.strides[0], view.strides[1]


def test_a_borrowed_view_is_the_array_itself():
    array = np.arange(12.0).reshape(3, 4)
    total, rows, columns, stride0, stride1 = _sum_and_mark(array, 1)
    assert (total, rows, columns, stride0, stride1) == (66.0, 3, 4, 32, 8)
    assert array[1, 0] == -1 and array.sum() == 66.0 - 4.0 - 1.0


def test_a_borrowed_view_keeps_strides_of_a_strided_array():
    base = np.arange(24.0).reshape(4, 6)
    strided = base[::2, 1::2]  # (2, 3), not contiguous
    expected = strided.sum()
    total, rows, columns, stride0, stride1 = _sum_and_mark(strided, 0)
    assert (total, rows, columns, stride0, stride1) == (expected, 2, 3, 96, 16)
    assert base[0, 1] == -1 and base[0, 0] == 0
