"""Which episodes of a step go to trajectories.jsonl."""

from drmas_train.run.runlog import logged_episodes


def test_one_episode_of_every_group_comes_first():
    groups = [0, 0, 0, 1, 1, 1]
    assert logged_episodes(groups, 2) == [0, 3]
    assert logged_episodes(groups, 3) == [0, 3, 1]


def test_more_than_the_group_count_logs_the_later_episodes_too():
    groups = [0, 0, 0, 1, 1, 1]
    assert logged_episodes(groups, 4) == [0, 3, 1, 4]
    assert logged_episodes(groups, 32) == [0, 3, 1, 4, 2, 5]  # every episode, once


def test_uneven_or_interleaved_groups_and_zero():
    assert logged_episodes([0, 0, 1], 3) == [0, 2, 1]
    assert logged_episodes([1, 0, 1, 0], 2) == [0, 1]
    assert logged_episodes([0, 0], 0) == []
    assert logged_episodes([], 4) == []
