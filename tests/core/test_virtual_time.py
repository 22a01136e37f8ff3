"""The virtual clock's actions (hetpipe_tf/core/virtual_time.py)."""

from hetpipe_tf.core.schedule import TaskKind
from hetpipe_tf.core.virtual_time import Action, ActionKind, batch_order, ordered


def test_equal_times_keep_the_causal_order_and_entries_give_the_batch_order():
    t = 1.0
    task = Action(t, ActionKind.TASK, 0, stage=0, minibatch=3, task=TaskKind.FORWARD, end=2.0)
    done = Action(t, ActionKind.PULL_DONE, 0, wave=0, end=t)
    read = Action(t, ActionKind.PULL_READ, 0, wave=0, end=t)
    push = Action(t, ActionKind.PUSH, 1, wave=0, end=t)
    back = Action(0.5, ActionKind.TASK, 1, stage=0, minibatch=1, task=TaskKind.BACKWARD,
                  end=0.7)
    first = Action(0.0, ActionKind.TASK, 1, stage=0, minibatch=1, task=TaskKind.FORWARD,
                   end=0.5)
    assert ordered([task, done, read, push, back, first]) == (first, back, push, read, done,
                                                             task)
    assert task.entry and first.entry and not back.entry and not push.entry
    assert batch_order(ordered([task, back, first])) == ((1, 1), (0, 3))
