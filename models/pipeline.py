"""Running a stack of identical layers: a scan, or a GPipe pipeline over the ``stage`` axis.

Layer parameters are stacked along a leading ``layers`` dimension. Without pipelining the
stack is one `lax.scan` (one while loop in HLO, so compile time does not grow with depth
and every per-layer collective sits in the loop body with a known trip count).

With ``pp`` the ``layers`` dimension is sharded over ``stage``, and `gpipe` runs a
`shard_map` that is manual over ``stage`` only (data/model axes stay automatic, so
``dp`` and ``tp`` compose with it). GPipe (Huang et al., 2019): the batch is split into
M microbatches; at tick t stage s runs its local layers on microbatch t - s and passes
the result to stage s + 1 with `ppermute`; M + S - 1 ticks fill and drain the pipe.
The backward pass is autodiff of this loop, whose transposed `ppermute` sends
gradients back up the pipe — GPipe's all-forward-then-all-backward schedule.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import Mesh, PartitionSpec as P

from lagom_jax.program.environment import parse_version

# layer(params_of_one_layer, x, enc, bias) -> x
LayerFn = Callable[[Any, jax.Array, jax.Array | None, jax.Array | None], jax.Array]

_cp = jax.checkpoint_policies
_PROJ = ("query_proj", "key_proj", "value_proj", "qkv_proj")
# Rematerialisation policies by MaxText's names (AI-Hypercomputer/maxtext, the decoder's
# remat policy table): what each layer keeps for the backward pass; the rest is recomputed.
# The names refer to `checkpoint_name` tags in the layers (llama.py). None: no remat.
REMAT_POLICIES: dict[str, Any] = {
    "none": None,  # keep everything (no jax.checkpoint)
    # Every weight matmul's output without a batch dimension: not the experts' (a dot batched
    # over the experts), which are recomputed in the backward pass.
    "minimal": _cp.checkpoint_dots_with_no_batch_dims,
    "minimal_flash": _cp.save_from_both_policies(_cp.checkpoint_dots_with_no_batch_dims,
                                                 _cp.save_only_these_names("context")),
    "save_dot_except_mlpwi": _cp.save_only_these_names(*_PROJ, "out_proj", "mlpwo"),
    "save_dot_except_mlp": _cp.save_only_these_names(*_PROJ, "out_proj"),
    "save_qkv_proj": _cp.save_only_these_names(*_PROJ),
    # MaxText's ``remat_policy: custom`` as its GPU MoE recipes set it (q/k/v/out and
    # mlpwi_0/mlpwi_1/mlpwo on the device, e.g. AI-Hypercomputer/gpu-recipes' Mixtral 8x7B on
    # A3 Ultra): every projection's output kept, the experts' included.
    "save_proj_and_mlp": _cp.save_only_these_names(*_PROJ, "out_proj", "mlpwi_0", "mlpwi_1", "mlpwo"),
    "full": _cp.nothing_saveable,  # only the layer's input
}


def check_remat(remat: str) -> None:
    if remat not in REMAT_POLICIES:
        raise ValueError(f"unknown remat policy {remat!r}; known: {', '.join(REMAT_POLICIES)}")


def scan_layers(layer: LayerFn, params: Any, x: jax.Array, enc: jax.Array | None,
                bias: jax.Array | None, *, remat: str = "none", scan: bool = True) -> jax.Array:
    """The layers one after another: a `lax.scan` over the stacked parameters (one while
    loop in HLO), or unrolled (``scan=False``; ``params`` a tuple of per-layer trees, or
    stacked), each layer rematerialised by ``remat``."""
    check_remat(remat)
    if remat != "none":
        layer = jax.checkpoint(layer, policy=REMAT_POLICIES[remat], prevent_cse=not scan)

    def body(h: jax.Array, p: Any) -> tuple[jax.Array, None]:
        return layer(p, h, enc, bias), None

    if scan:
        return jax.lax.scan(body, x, params)[0]
    # Unrolled: one tree per layer (``layers.unstack_layers``), or slices of a stacked one.
    per_layer = params if isinstance(params, (tuple, list)) else [
        jax.tree.map(lambda a, i=i: a[i], params) for i in range(jax.tree.leaves(params)[0].shape[0])]
    for p in per_layer:
        x = body(x, p)[0]
    return x


def _split(x: jax.Array, m: int) -> jax.Array:
    """``x``'s batch as ``m`` microbatches, microbatch ``i`` holding rows ``i, i + m, ...``: a
    strided split keeps the batch's data-parallel sharding on the rows of every microbatch
    (a split into contiguous blocks would put it on the microbatch axis, and each tick would
    gather one whole microbatch to every data rank and compute it there again)."""
    return x.reshape(x.shape[0] // m, m, *x.shape[1:]).swapaxes(0, 1)


def _join(xs: jax.Array) -> jax.Array:
    """The inverse of ``_split``."""
    return xs.swapaxes(0, 1).reshape(xs.shape[0] * xs.shape[1], *xs.shape[2:])


# jax 0.12 refuses BERT's stage under check_vma: a ``polynomial`` primitive in its layer
# gets a stage-varying operand beside constants and raises "Primitive polynomial
# requires varying manual axes to match"; JAX's message names check_vma=False as the
# workaround. The pipeline is checked against the single-device step either way
# (tests/test_models.py), and before 0.11 it keeps the check.
_CHECK_VMA = parse_version(jax.__version__)[:2] < (0, 11)  # (seen on 0.12.0.1; 0.11.2 not tried)


@dataclasses.dataclass(frozen=True)
class Pipeline:
    """GPipe over mesh axis ``stage`` with ``microbatches`` microbatches.

    The shard_map is manual over ``data`` too, where the mesh has it: a stage's weights are
    made data-varying before the tick loop, so every tick adds its gradient to a local sum and
    the sum is reduced over ``data`` once, after the loop. Left to the partitioner (``data``
    automatic), XLA reduced each layer's gradient inside the transposed loop, every tick:
    ``microbatches + stages - 1`` times the traffic (gpt2 355M, data 2 x stage 4 on 8 A40:
    114 all-reduces of 25 MB per step, 230 ms of a 775 ms step). The shared inputs (the
    micro-batches, the encoder's output, a T5's position bias) are made stage-varying for the
    same reason."""

    mesh: Mesh
    microbatches: int

    def __call__(self, layer: LayerFn, params: Any, x: jax.Array, enc: jax.Array | None,
                 bias: jax.Array | None, remat: str = "none") -> jax.Array:
        stages, m = self.mesh.shape["stage"], self.microbatches
        xs = _split(x, m)
        encs = None if enc is None else _split(enc, m)
        shift = [(s, s + 1) for s in range(stages - 1)]
        data = ("data",) if self.mesh.shape.get("data", 1) > 1 else ()
        rows = P(None, *data)  # [microbatch, rows, ...]: the rows over data

        def staged(params: Any, xs: jax.Array, encs: jax.Array | None,
                   bias: jax.Array | None) -> jax.Array:
            s = jax.lax.axis_index("stage")
            # Varying before the loop: the transposes (the gradients' sums over the axes)
            # run once, here, and not at each use inside the loop.
            if data:
                params = jax.lax.pcast(params, data, to="varying")
            xs, encs = jax.lax.pcast((xs, encs), "stage", to="varying")
            if bias is not None:
                bias = jax.lax.pcast(bias, ("stage", *data), to="varying")

            def tick(carry: tuple[jax.Array, jax.Array], t: jax.Array):
                state, outs = carry
                inp = jnp.where(s == 0, xs[jnp.minimum(t, m - 1)], state)
                mb = jnp.clip(t - s, 0, m - 1)  # the microbatch this stage holds at tick t
                out = scan_layers(layer, params, inp, None if encs is None else encs[mb], bias, remat=remat)
                j = jnp.clip(t - (stages - 1), 0, m - 1)
                done = (s == stages - 1) & (t >= stages - 1)
                outs = outs.at[j].set(jnp.where(done, out, outs[j]))
                return (jax.lax.ppermute(out, "stage", shift), outs), None

            init = (jnp.zeros_like(xs[0]), jnp.zeros_like(xs))
            (_, outs), _ = jax.lax.scan(tick, init, jnp.arange(m + stages - 1))
            # Only the last stage wrote outputs; the sum hands them to every stage.
            return jax.lax.psum(outs, "stage")

        run = jax.shard_map(staged, mesh=self.mesh, in_specs=(P("stage"), rows, rows, P()),
                            out_specs=rows, axis_names={"stage", *data}, check_vma=_CHECK_VMA)
        return _join(run(params, xs, encs, bias))


@dataclasses.dataclass(frozen=True)
class Stack:
    """How a model runs its layer stacks: scanned (or unrolled) with a remat policy, or
    `pipeline` when ``pp`` is on."""

    pipeline: Pipeline | None = None
    remat: str = "none"
    scan: bool = True

    def __post_init__(self) -> None:
        check_remat(self.remat)

    def __call__(self, layer: LayerFn, params: Any, x: jax.Array, enc: jax.Array | None = None,
                 bias: jax.Array | None = None) -> jax.Array:
        if self.pipeline is None:
            return scan_layers(layer, params, x, enc, bias, remat=self.remat, scan=self.scan)
        return self.pipeline(layer, params, x, enc, bias, remat=self.remat)
