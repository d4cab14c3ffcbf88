"""lagom-jax: contention-aware tuning of communication/computation overlap in JAX.

The public surface; everything else is reached through these modules.
"""

from lagom_jax.quiet import import_jax_quietly as _import_jax_quietly

_import_jax_quietly()  # before any module below imports JAX


def _warn_outside_the_tested_range() -> None:
    import warnings

    import jax

    from lagom_jax.program.environment import JaxVersionWarning, range_warning

    message = range_warning(jax.__version__)
    if message is not None:
        warnings.warn(message, JaxVersionWarning, stacklevel=3)


_warn_outside_the_tested_range()


def _prepare_deviceless() -> None:
    # Before the user's program starts JAX's backends: on a GPU-less host, no CUDA plugin
    # traceback, and the plugin registered for compiling the step for GPUs.
    from lagom_jax.program import gpu_compile

    gpu_compile.prepare()


_prepare_deviceless()

from lagom_jax.advise.configtuner import advise_train_step as advise_train_step
from lagom_jax.advise.predict import (AssumedNetworkWarning as AssumedNetworkWarning,
                                      predict_hlo_step_ms as predict_hlo_step_ms,
                                      predict_train_step_ms as predict_train_step_ms)
from lagom_jax.api import (RetuneWarning as RetuneWarning, Tuned as Tuned, TuningWarning as TuningWarning,
                           auto_hardware as auto_hardware, tune as tune)
from lagom_jax.cluster.hardware import HardwareProfile as HardwareProfile
from lagom_jax.cluster.params import CollectiveParams as CollectiveParams
from lagom_jax.costs.simulate import Timeline as Timeline
from lagom_jax.plan.cache import PlanCache as PlanCache
from lagom_jax.plan.planning import (BASELINES as BASELINES, Planned as Planned, VERSION as __version__,
                                     make_plan as make_plan)
from lagom_jax.plan.schema import CollectiveChoice as CollectiveChoice, Plan as Plan
from lagom_jax.program.custom_calls import UnpricedWarning as UnpricedWarning
from lagom_jax.program.flags import FlagError as FlagError, XlaFlag as XlaFlag
from lagom_jax.program.graph import (StepGraph as StepGraph, Task as Task, from_hlo_text as from_hlo_text,
                                     from_module as from_module)
from lagom_jax.program.hlo import HloParseError as HloParseError, parse as parse_hlo
from lagom_jax.search import (SearchResult as SearchResult, STRATEGIES as STRATEGIES,
                              run_strategy as run_strategy)

__all__ = [
    "AssumedNetworkWarning", "BASELINES", "CollectiveChoice", "CollectiveParams", "FlagError", "HardwareProfile",
    "HloParseError", "Plan", "PlanCache", "Planned", "RetuneWarning", "STRATEGIES", "SearchResult", "StepGraph", "Task",
    "Timeline", "Tuned", "TuningWarning", "UnpricedWarning", "XlaFlag", "__version__", "auto_hardware",
    "from_hlo_text", "from_module", "make_plan", "parse_hlo", "predict_hlo_step_ms", "predict_train_step_ms", "run_strategy", "tune",
]
