"""A user's jitted step, whatever wraps it, met at JAX's AOT stages (trace ▸ lower ▸ compile).

Users jit through wrappers: ``jax.jit`` and pjit, ``eqx.filter_jit``, ``nnx.jit``, haliax's
``named_jit`` (Levanter). They share one interface:

- each has ``lower(*args, **kwargs)``, which calls ``jax.jit(...).lower`` inside on the arrays
  it keeps dynamic, so :func:`lower` under ``jax_internals.lowering_for`` gets the CUDA
  lowering of any of them on a host whose arrays live on CPU devices;
- ``lower`` returns JAX's ``jax.stages.Lowered`` or the wrapper's own stage holding one
  (equinox's and flax's ``Lowered.lowered``): :func:`jax_lowered` finds it;
- that stage's ``compile(compiler_options=...)`` returns a ``Compiled``: JAX's, which takes
  the arguments ``jax.jit`` was given, or the wrapper's, which is called like the wrapper
  (equinox and flax re-split the arguments and apply ``nnx`` state updates themselves).
  :func:`executable` tells which and refuses, with the reason, a JAX ``Compiled`` whose
  arguments are not the step's (haliax's ``named_jit`` lowers the inner function of its own
  argument split, so nothing compiled from its ``lower`` can be called with the step's).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from lagom_jax.program import jax_internals

__all__ = ["Executable", "describe", "executable", "has_stages", "jax_compiled", "jax_lowered", "lower",
           "platform_of"]


def describe(obj: Any) -> str:
    """``module.Type`` of ``obj`` (a function: its qualified name), as a user would look it up."""
    if callable(obj) and hasattr(obj, "__qualname__") and not hasattr(obj, "lower"):
        return f"the function {getattr(obj, '__module__', '?')}.{obj.__qualname__}"
    kind = type(obj)
    return f"{kind.__module__}.{kind.__qualname__}"


def has_stages(fn: Any) -> bool:
    """Whether ``fn`` can be lowered ahead of time (a jitted step of any wrapper)."""
    return callable(getattr(fn, "lower", None))


def lower(fn: Any, args: tuple, kwargs: Mapping[str, Any], platform: str | None = None) -> Any:
    """``fn.lower(*args, **kwargs)``, the wrapper's own stage; for ``platform`` when given."""
    if platform is None:
        return fn.lower(*args, **kwargs)
    with jax_internals.lowering_for((platform,)):
        return fn.lower(*args, **kwargs)


def _inner(obj: Any, cls: type, what: str) -> Any:
    if isinstance(obj, cls):
        return obj
    if dataclasses.is_dataclass(obj):
        values = [getattr(obj, f.name, None) for f in dataclasses.fields(obj)]
    else:
        values = list(getattr(obj, "__dict__", {}).values())
    for value in values:
        if isinstance(value, cls):
            return value
    raise TypeError(f"{describe(obj)} holds no jax.stages.{what}; lagom-jax reads the step through JAX's own "
                    "AOT stages, which this wrapper does not expose")


def jax_lowered(stage: Any) -> Any:
    """JAX's ``Lowered`` in a wrapper's lowered stage (the stage itself for ``jax.jit``)."""
    import jax

    return _inner(stage, jax.stages.Lowered, "Lowered")


def jax_compiled(stage: Any) -> Any:
    """JAX's ``Compiled`` in a wrapper's compiled stage (the stage itself for ``jax.jit``)."""
    import jax

    return _inner(stage, jax.stages.Compiled, "Compiled")


def platform_of(args: tuple, kwargs: Mapping[str, Any]) -> str:
    """The platform the step's arrays live on (JAX's default one when it has none)."""
    import jax

    for leaf in jax.tree_util.tree_leaves((args, dict(kwargs))):
        if isinstance(leaf, jax.Array):
            return next(iter(leaf.sharding.device_set)).platform
    return jax.devices()[0].platform


@dataclasses.dataclass(frozen=True)
class Executable:
    """An executable compiled from the step's lowered stage, and how it is called.

    ``whole_call``: it takes the step's own arguments (a wrapper's ``Compiled``); otherwise
    the arguments ``jax.jit`` takes, without its static ones.
    """

    compiled: Any
    whole_call: bool

    def __call__(self, args: tuple, kwargs: Mapping[str, Any], dyn_args: tuple, dyn_kwargs: Mapping[str, Any]):
        if self.whole_call:
            return self.compiled(*args, **kwargs)
        return self.compiled(*dyn_args, **dyn_kwargs)

    def as_text(self) -> str:
        return jax_compiled(self.compiled).as_text()


def executable(lowered: Any, options: Mapping[str, Any], dyn_args: tuple, dyn_kwargs: Mapping[str, Any],
               what: str) -> tuple[Executable | None, str]:
    """The wrapper's lowered stage compiled with ``options``, and how to call it; or None and
    why it cannot run in this process (the step's arguments are not what it takes)."""
    import jax

    compiled = lowered.compile(compiler_options=dict(options))
    if not isinstance(compiled, jax.stages.Compiled):
        jax_compiled(compiled)  # a wrapper's stage over JAX's: TypeError if it is not one
        return Executable(compiled, whole_call=True), ""
    given = jax.tree_util.tree_structure((tuple(dyn_args), dict(dyn_kwargs)))
    if compiled.in_tree == given:
        return Executable(compiled, whole_call=False), ""
    return None, (f"{what} compiles a function of its own split of the step's arguments, and its lowered "
                  "stage gives no way to call that executable with the step's own")
