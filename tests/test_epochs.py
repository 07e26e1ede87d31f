"""The epoch cursor of the framework adapters (``npyfeed._epochs.EpochCursor``): the position moves past every batch
served; after an epoch's last batch a new pass reads the next epoch; Keras' begin/end pairs move the current epoch
only when its last batch was read inside the pair (its reads for the element spec, its model-building read and its
extra on_epoch_end never do); set_epoch and restore; one epoch range."""

from __future__ import annotations

import pytest
from npyfeed._checks import EPOCH_LIMIT
from npyfeed._epochs import EpochCursor


def test_a_pass_reads_from_the_position_and_the_last_batch_moves_it_to_the_next_epoch():
    cursor = EpochCursor(3, epoch=5)
    assert cursor.position() == (5, 0) and cursor.epoch == 5
    assert cursor.next_pass() == (5, 0)
    assert cursor.served(0, 5) == (5, 0)
    assert cursor.position() == (5, 1)
    cursor.served(1, 5)
    assert cursor.position() == (5, 2)
    cursor.served(2, 5)  # the last batch: a checkpoint now resumes at the next epoch
    assert cursor.position() == (6, 0)
    assert cursor.next_pass() == (6, 0) and cursor.epoch == 6


def test_served_returns_the_batch_expected():
    cursor = EpochCursor(4)
    assert cursor.served(0) == (0, 0)
    assert cursor.served(1) == (0, 1)
    assert cursor.served(3) == (0, 2)  # a jump: the caller warns
    assert cursor.served(0) == (0, 4)


def test_keras_reads_outside_an_epoch_never_move_it():
    cursor = EpochCursor(2, epoch=3)
    # The TensorFlow backend reads items 0 and 1 (the last) for the element spec, outside any epoch.
    cursor.served(0)
    cursor.served(1)
    cursor.end_pass()  # and an extra on_epoch_end before the first epoch
    assert cursor.epoch == 3
    # The JAX backend reads item 0 to build the model inside a begin/end pair of its own.
    cursor.begin_pass()
    cursor.served(0)
    cursor.end_pass()
    assert cursor.epoch == 3
    for expected_epoch in (3, 4):  # two real epochs
        cursor.begin_pass()
        assert [cursor.served(b)[0] for b in range(2)] == [expected_epoch] * 2
        cursor.end_pass()
    assert cursor.epoch == 5


def test_keras_steps_per_epoch_shorter_than_an_epoch():
    cursor = EpochCursor(5, epoch=0)
    cursor.begin_pass()
    for b in range(3):
        cursor.served(b)
    cursor.end_pass()
    assert cursor.epoch == 0  # the epoch carries on in the next Keras epoch
    cursor.begin_pass()
    cursor.served(3)
    cursor.served(4)
    cursor.served(0)  # Keras goes on with the next epoch's first batches before on_epoch_end
    cursor.end_pass()
    assert cursor.epoch == 1


def test_set_epoch_and_restore():
    cursor = EpochCursor(4, epoch=2)
    cursor.next_pass()
    cursor.served(0, 2)
    cursor.set_epoch(9)
    assert cursor.position() == (9, 0)
    cursor.restore(7, 3)
    assert cursor.position() == (7, 3)
    cursor.restore(7, 4)  # saved after the epoch's last batch
    assert cursor.position() == (8, 0)
    # set_epoch forgets a last batch read in a pass: the epoch set is read, not the one after it.
    cursor.begin_pass()
    cursor.served(3, 8)
    cursor.set_epoch(1)
    cursor.end_pass()
    assert cursor.epoch == 1


@pytest.mark.parametrize("call", ["init", "set_epoch", "restore"])
def test_one_epoch_range(call):
    def do(epoch):
        if call == "init":
            return EpochCursor(3, epoch)
        cursor = EpochCursor(3)
        return cursor.set_epoch(epoch) if call == "set_epoch" else cursor.restore(epoch, 0)

    do(EPOCH_LIMIT - 1)
    for bad in (EPOCH_LIMIT, -1):
        with pytest.raises(ValueError, match=r"epoch must be an integer in \[0, 2\*\*62\)"):
            do(bad)


def test_restore_refuses_a_batch_outside_the_epoch():
    cursor = EpochCursor(3)
    with pytest.raises(ValueError, match="batch"):
        cursor.restore(0, 4)
    with pytest.raises(ValueError, match="batch"):
        cursor.restore(0, -1)
