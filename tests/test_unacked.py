"""An actor's unacknowledged episodes: kept until the coordinator counts them, the oldest given up
beyond the bound, in the order they finished."""

import numpy as np
import pytest

from rlmq.actors.unacked import UnackedEpisodes


def test_episodes_are_kept_until_acknowledged_and_the_oldest_given_up_beyond_the_bound() -> None:
    unacked = UnackedEpisodes(most=5)
    assert unacked.add(np.array([1.0, 2.0, 3.0]), np.array([10, 20, 30])) == 0
    assert unacked.add(np.array([4.0, 5.0, 6.0, 7.0]), np.array([40, 50, 60, 70])) == 2
    assert unacked.returns.tolist() == [3.0, 4.0, 5.0, 6.0, 7.0]
    assert unacked.lengths.tolist() == [30, 40, 50, 60, 70]
    assert unacked.returns.dtype == np.float64 and unacked.lengths.dtype == np.int64

    unacked.keep_newest(2)  # the coordinator counted all but the last two
    assert unacked.returns.tolist() == [6.0, 7.0] and unacked.lengths.tolist() == [60, 70]
    unacked.keep_newest(9)  # an acknowledgement older than what we hold drops nothing
    assert len(unacked) == 2
    unacked.keep_newest(-1)  # nor does one that names more than we sent keep anything
    assert len(unacked) == 0
    assert unacked.add(np.zeros(0), np.zeros(0, np.int64)) == 0 and len(unacked) == 0
    with pytest.raises(ValueError, match="2 returns against 1 lengths"):
        unacked.add(np.zeros(2), np.zeros(1, np.int64))
