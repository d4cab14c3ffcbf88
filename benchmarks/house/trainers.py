"""The decorator on a train step nobody here wrote: Levanter's Llama under each wrapper users jit with.

    python -m benchmarks.house.trainers [--write]

Needs Levanter (``pip install marin-levanter``, which brings haliax and equinox; it is not a
test dependency). The step is Levanter's ``LlamaLMHeadModel`` (2 layers, width 256, 4 heads
over 2 KV heads, vocabulary 1024, 128 tokens, batch 8) with its own
``compute_next_token_loss`` and AdamW, parameters under FSDP over 8 fake CPU devices
(haliax axis mapping ``embed -> data``), tuned for ``h100-sxm-8``. It is jitted three ways:
``jax.jit``, ``eqx.filter_jit`` and haliax's ``named_jit`` (how Levanter's ``Trainer`` jits
it). Per wrapper, three steps are run through ``lagom_jax.tune`` and recorded: how many times
it tuned, every warning, the plan's flags and predicted speedup over XLA's defaults, the
first call's seconds, and whether the losses equal the untuned step's. ``--write`` records
it as the ``trainers`` section of RESULTS.md.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import tempfile
import time
import warnings

from benchmarks.common import machine_line, write_section


def _setup():
    import equinox as eqx
    import haliax as hax
    import jax
    import numpy as np
    import optax
    from jax.sharding import Mesh
    from levanter.models.llama import LlamaConfig, LlamaLMHeadModel
    from levanter.models.lm_model import LmExample

    mesh = Mesh(np.array(jax.devices()).reshape(8, 1), ("data", "model"))
    params_map = {"embed": "data", "mlp": "model", "heads": "model", "batch": "data"}
    compute_map = {"batch": "data", "mlp": "model", "heads": "model"}
    cfg = LlamaConfig(max_seq_len=128, hidden_dim=256, intermediate_dim=512, num_layers=2, num_heads=4,
                      num_kv_heads=2)
    vocab, batch = hax.Axis("vocab", 1024), hax.Axis("batch", 8)
    opt = optax.adamw(1e-3)

    def train_step(model, opt_state, tokens):
        def loss_fn(m):
            example = hax.vmap(LmExample.causal, batch)(tokens)
            with hax.axis_mapping(compute_map):
                return m.compute_next_token_loss(example).scalar()

        loss, grads = eqx.filter_value_and_grad(loss_fn)(model)
        updates, opt_state = opt.update(grads, opt_state, eqx.filter(model, eqx.is_array))
        return eqx.apply_updates(model, updates), opt_state, loss

    def init():
        model = hax.named_jit(lambda k: LlamaLMHeadModel.init(vocab, cfg, key=k), axis_resources=params_map)(
            jax.random.key(0))
        opt_state = hax.named_jit(lambda m: opt.init(eqx.filter(m, eqx.is_array)), axis_resources=params_map)(model)
        tokens = hax.random.randint(jax.random.key(1), (batch, cfg.max_Pos), 0, vocab.size)
        return model, opt_state, tokens

    wrappers = {"jax.jit": jax.jit(train_step), "eqx.filter_jit": eqx.filter_jit(train_step),
                "haliax named_jit": hax.named_jit(train_step, axis_resources=params_map)}
    return mesh, params_map, init, wrappers


def _run(step, init, steps=3):
    import jax

    model, opt_state, tokens = init()
    losses = []
    start = time.perf_counter()
    first = None
    for _ in range(steps):
        model, opt_state, loss = step(model, opt_state, tokens)
        losses.append(float(jax.block_until_ready(loss)))
        first = first if first is not None else time.perf_counter() - start
    return losses, first, (model, opt_state, tokens)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--write", action="store_true")
    args = parser.parse_args(argv)
    import jax

    jax.config.update("jax_num_cpu_devices", 8)
    import haliax as hax

    import lagom_jax

    mesh, params_map, init, wrappers = _setup()
    rows = []
    with (hax.set_mesh(mesh) if hasattr(hax, "set_mesh") else mesh), hax.axis_mapping(params_map):
        for name, step in wrappers.items():
            expected, untuned_first, _ = _run(step, init)
            tuned = lagom_jax.tune(step, hardware="h100-sxm-8", cache_dir=tempfile.mkdtemp(prefix="lagom-trainers-"),
                                   plan_dir=tempfile.mkdtemp(prefix="lagom-trainers-plans-"))
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                losses, first, last = _run(tuned, init)
            said = [f"{w.category.__name__}: {str(w.message)[:160]}" for w in caught
                    if issubclass(w.category, (lagom_jax.TuningWarning, lagom_jax.RetuneWarning))]
            plan = tuned.plan(*last)
            rows.append((name, tuned.tunes, untuned_first, first, losses == expected, plan, said))
            print(f"{name}: tuned {tuned.tunes}x, first call {first:.1f} s (untuned {untuned_first:.1f} s), "
                  f"same losses {losses == expected}, {len(said)} warning(s)", flush=True)
    lines = ["## trainers", "",
             f"Machine: {machine_line()}; " + ", ".join(f"{p} {importlib.metadata.version(p)}" for p in
                                                       ("marin-levanter", "marin-haliax", "equinox")) + ".", "",
             "The decorator on Levanter's Llama (`LlamaLMHeadModel`, 2 layers, width 256, vocabulary 1024, "
             "128 tokens, batch 8) with its own loss and AdamW, FSDP over 8 fake CPU devices through haliax's "
             "axis mapping, tuned for `h100-sxm-8` under each wrapper; 3 steps each. Seconds are *measured* "
             "here (one run, the first call includes compiling); speedups are *predicted*.", "",
             "| wrapper | tunes | first call s (untuned) | losses as untuned | predicted speedup | flags | warnings |",
             "|---|---|---|---|---|---|---|"]
    for name, tunes, untuned_first, first, same, plan, said in rows:
        speed = f"{plan.speedup_over('xla-default'):.3f}x" if plan is not None else "-"
        flags = f"`{plan.xla_flags()}`" if plan is not None and plan.flags else "-"
        lines.append(f"| {name} | {tunes} | {first:.1f} ({untuned_first:.1f}) | {'yes' if same else 'NO'} | {speed} | "
                     f"{flags} | {'; '.join(said) or 'none'} |")
    text = "\n".join(lines)
    print(text)
    if args.write:
        write_section("trainers", text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
