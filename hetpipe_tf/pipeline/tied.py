"""Tied weights across stages: a trainable variable used by layers of two stages (GPT-2's
token embedding, reused by its LM head on the last stage).

The first stage that uses the variable OWNS it: its `StageWeights` keep the variable's
versions and its optimizer applies it, once per minibatch, so the model (and a checkpoint)
holds one copy. A later stage BORROWS it: for minibatch p it computes with the owner's
version of p, which the owner hands over when it takes p's version (a copy on the
borrower's device, made per minibatch by TensorFlow when the borrower's compiled call reads
it), and its gradient is summed into the owner's gradient of p. The owner is the earliest
stage, so its forward of p runs before every borrower's and its backward after every
borrower's: the sum is complete when the owner's backward ends and p commits. Both stages
therefore compute with the same version of p and the weight takes one update from the
summed gradient; the copies cannot drift (there is one variable, and per-minibatch copies
of its version). Per minibatch this moves the weight to each borrower and its gradient
back, as DeepSpeed's tied-layer all-reduce moves the gradient both ways.

`Stage.for_plan` splits each stage's variables into own (`trainable`), `borrowed` and
`lent`; the runtime calls `with_borrowed` after taking a stage's version and `own_grads`
on the stage's weight gradients.
"""

from __future__ import annotations

from typing import Any, MutableMapping, Sequence

import tensorflow as tf


def with_borrowed(stage: Any, tied: MutableMapping[int, Any], tvals: Sequence) -> list:
    """The stage's trainable values for one minibatch: its own version's (`tvals`), then
    the borrowed variables' values as their owners lent them. Records the values of the
    stage's own variables that later stages borrow into `tied`."""
    own = list(tvals)
    if not stage.lent and not stage.borrowed:
        return own
    for v in stage.lent:
        tied[id(v)] = own[_index(stage.trainable, v)]
    return own + [tied[id(v)] for v in stage.borrowed]


def own_grads(stage: Any, tied_grads: MutableMapping[int, Any], tied: MutableMapping[int, Any],
              wg: Sequence) -> list:
    """The gradients of the stage's own variables: the borrowed variables' gradients go to
    `tied_grads` (summed over borrowers) and the owner adds them to its own; the owner
    also lets go of the values it lent (every borrower is done with them)."""
    n = len(stage.trainable)
    own = list(wg[:n])
    if not stage.lent and not stage.borrowed:
        return own
    with tf.device(stage.device):
        for v, g in zip(stage.borrowed, wg[n:]):
            tied_grads[id(v)] = _sum(tied_grads.get(id(v)), g)
        for v in stage.lent:
            k = _index(stage.trainable, v)
            own[k] = _sum(own[k], tied_grads.pop(id(v), None))
            tied.pop(id(v), None)
    return own


def _sum(a: Any, b: Any) -> Any:
    if a is None or b is None:
        return b if a is None else a
    # A gather's gradient (an embedding lookup) may be IndexedSlices: add densely.
    return tf.convert_to_tensor(a) + tf.convert_to_tensor(b)


def refuse_borrowed(stages: Sequence[Any], what: str) -> None:
    """Raise ValueError if a stage borrows a tied weight where `what` (an executor) does
    not hand borrowed weights and their gradients between stages."""
    for stage in stages:
        if stage.borrowed:
            raise ValueError(
                f"Tied weights split across stages are not supported with {what} yet. "
                f"Received: stage {stage.index} borrows "
                f"{[getattr(v, 'path', v.name) for v in stage.borrowed]}; keep the layer's "
                "calls in one stage (a plan that cuts elsewhere) or use the default HETPIPE "
                "schedule.")


def _index(variables: Sequence, v: Any) -> int:
    return next(k for k, x in enumerate(variables) if x is v)
