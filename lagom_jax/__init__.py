"""lagom-jax: contention-aware tuning of communication/computation overlap in JAX.

The public surface; everything else is reached through these modules.
"""

from lagom_jax.quiet import import_jax_quietly as _import_jax_quietly

_import_jax_quietly()  # before any module below imports JAX


def _warn_outside_the_tested_range() -> None:
    import warnings

    import jax

    from lagom_jax.environment import JaxVersionWarning, range_warning

    message = range_warning(jax.__version__)
    if message is not None:
        warnings.warn(message, JaxVersionWarning, stacklevel=3)


_warn_outside_the_tested_range()

from lagom_jax.api import Tuned as Tuned
from lagom_jax.api import TuningWarning as TuningWarning
from lagom_jax.api import auto_hardware as auto_hardware
from lagom_jax.api import tune as tune
from lagom_jax.custom_calls import UnpricedWarning as UnpricedWarning
from lagom_jax.flags import FlagError as FlagError
from lagom_jax.flags import XlaFlag as XlaFlag
from lagom_jax.graph import StepGraph as StepGraph
from lagom_jax.graph import Task as Task
from lagom_jax.graph import from_hlo_text as from_hlo_text
from lagom_jax.graph import from_module as from_module
from lagom_jax.hardware import HardwareProfile as HardwareProfile
from lagom_jax.hlo import HloParseError as HloParseError
from lagom_jax.hlo import parse as parse_hlo
from lagom_jax.params import CollectiveParams as CollectiveParams
from lagom_jax.plan import CollectiveChoice as CollectiveChoice
from lagom_jax.plan import Plan as Plan
from lagom_jax.cache import PlanCache as PlanCache
from lagom_jax.predict import predict_hlo_step_ms as predict_hlo_step_ms
from lagom_jax.predict import predict_train_step_ms as predict_train_step_ms
from lagom_jax.planning import BASELINES as BASELINES
from lagom_jax.planning import VERSION as __version__
from lagom_jax.planning import Planned as Planned
from lagom_jax.planning import make_plan as make_plan
from lagom_jax.search import STRATEGIES as STRATEGIES
from lagom_jax.search import SearchResult as SearchResult
from lagom_jax.search import run_strategy as run_strategy
from lagom_jax.simulate import Timeline as Timeline

__all__ = [
    "BASELINES", "CollectiveChoice", "CollectiveParams", "FlagError", "HardwareProfile",
    "HloParseError", "Plan", "PlanCache", "Planned", "STRATEGIES", "SearchResult", "StepGraph", "Task",
    "Timeline", "Tuned", "TuningWarning", "UnpricedWarning", "XlaFlag", "__version__", "auto_hardware",
    "from_hlo_text", "from_module", "make_plan", "parse_hlo", "predict_hlo_step_ms", "predict_train_step_ms", "run_strategy", "tune",
]
