"""The cluster model as a virtual clock's order (hetpipe_tf/sim/timeline.py)."""

import pytest

from hetpipe_tf.cluster.spec import paper_cluster
from hetpipe_tf.core.schedule import TaskKind
from hetpipe_tf.core.virtual_time import ActionKind, batch_order
from hetpipe_tf.sim import PSShard, SimConfig, SimStage, VirtualClock, VirtualWorker, simulate
from hetpipe_tf.sim.network import NetworkConfig
from hetpipe_tf.sim.timeline import timeline


def _vws():
    def vw(name, hosts, times):
        return VirtualWorker(name, tuple(
            SimStage(f"host{h}/gpu0", f"host{h}", t / 3, 2 * t / 3,
                     shards=(PSShard("host0", 4_000_000),)) for h, t in zip(hosts, times)), 8)
    return [vw("vw0", (0, 1), (0.01, 0.012)), vw("vw1", (2, 3), (0.02, 0.025))]


@pytest.mark.parametrize("n_m,d", [(1, 0), (2, 1), (3, 2)])
@pytest.mark.parametrize("network", [None, NetworkConfig()])
def test_actions_come_in_causal_order(n_m, d, network):
    cfg = SimConfig(n_m=n_m, clock_distance=d, num_waves=6, network=network)
    result = simulate(_vws(), cfg, paper_cluster())
    actions = timeline(result)
    assert [a.key() for a in actions] == sorted(a.key() for a in actions)
    tasks = [a for a in actions if a.kind is ActionKind.TASK]
    assert len(tasks) == len([e for e in result.events if e.task.kind is not TaskKind.APPLY])
    seen, landed, pulls = {}, set(), {}
    for i, a in enumerate(actions):
        if a.kind is ActionKind.TASK:
            # A task's input is there: the task before it of its minibatch ran already.
            if a.task is TaskKind.FORWARD and a.stage > 0:
                assert (a.vw, a.stage - 1, a.minibatch, TaskKind.FORWARD) in seen
            if a.task is TaskKind.BACKWARD:
                last = a.stage + 1 == 1   # both VWs have two stages
                nxt = TaskKind.FORWARD_BACKWARD if last else TaskKind.BACKWARD
                assert (a.vw, a.stage + 1, a.minibatch, nxt) in seen
            seen[(a.vw, a.stage, a.minibatch, a.task)] = i
        elif a.kind is ActionKind.PUSH:
            landed.add((a.vw, a.wave))
        elif a.kind is ActionKind.PULL_READ:
            # Every VW's push of the global wave the pull needs has landed.
            assert all((v, a.wave - d) in landed for v in range(2))
            assert (a.vw, a.wave) in landed
            pulls[(a.vw, a.wave)] = a.time
        else:
            assert pulls[(a.vw, a.wave)] <= a.time
    order = batch_order(actions)
    assert len(order) == 2 * cfg.num_minibatches
    for v in range(2):   # each VW's minibatches enter in order
        assert [p for w, p in order if w == v] == list(range(1, cfg.num_minibatches + 1))


def test_virtual_clock_checks_its_arguments():
    with pytest.raises(ValueError, match="cluster"):
        VirtualClock("paper")
    with pytest.raises(ValueError, match="Unknown host"):
        VirtualClock(paper_cluster(), ps_host="nowhere")
    with pytest.raises(ValueError, match="Unknown host"):
        VirtualClock(paper_cluster(), placement=(((("nowhere", 1.0),),),))
    with pytest.raises(ValueError, match=r"fraction.*Received: 1.5"):
        VirtualClock(paper_cluster(), placement=(((("host0", 1.5),),),))
