"""The window files the calibration chain and the evaluation write and read a window at a time."""

from __future__ import annotations

import numpy as np
import pytest

from genie_build.errors import GenieBuildError
from genie_build.quantize.window_stream import open_windows, write_windows


def test_windows_written_one_at_a_time_read_back_one_at_a_time(tmp_path):
    windows = np.random.default_rng(0).standard_normal((5, 1, 3, 4)).astype(np.float32)
    path = tmp_path / "stream.npy"
    with write_windows(path, 5) as out:
        for window in windows:
            assert not path.exists()   # the file appears only once every window is in
            out.append(window)
    assert np.array_equal(np.load(path), windows)   # an ordinary .npy file
    with open_windows(path) as stream:
        assert stream.shape == (5, 1, 3, 4) and stream.dtype == np.float32
        assert all(np.array_equal(stream.window(index), windows[index]) for index in (3, 0, 4))


def test_a_short_or_mismatched_file_is_refused_and_nothing_is_left(tmp_path):
    path = tmp_path / "stream.npy"
    with pytest.raises(ValueError, match="2 windows written of 3"), write_windows(path, 3) as out:
        out.append(np.zeros((1, 2), np.float32))
        out.append(np.zeros((1, 2), np.float32))
    with pytest.raises(ValueError, match="of shape"), write_windows(path, 3) as out:
        out.append(np.zeros((1, 2), np.float32))
        out.append(np.zeros((2, 2), np.float32))
    assert not path.exists()
    np.save(path, np.zeros((4, 8), np.float32))
    path.write_bytes(path.read_bytes()[:-4])
    with pytest.raises(GenieBuildError, match="not the \\[4, 8\\] float32 its header says"), open_windows(path):
        pass
    path.write_bytes(b"not numpy")
    with pytest.raises(GenieBuildError, match="not a .npy file"), open_windows(path):
        pass
