"""Search strategies: from a StepGraph and a HardwareProfile to the choices of a Plan.

A strategy picks, for one training step,

* the structure XLA builds: whether all-gather / reduce-scatter + matmul pairs run as
  windowed einsum (``passes.decompose``), per-kind combine thresholds
  (``passes.combine``), whether the latency-hiding scheduler places the waits
  (``passes.schedule``), how many collectives may be in flight, and which collectives
  are pipelined in pieces (``passes.chunk``);
* per collective, the NCCL parameters (algorithm, protocol, channels, chunk, threads),

and predicts the step with ``simulate``. Strategies:

* ``xla-default`` - XLA's defaults and NCCL's own per-call choice;
* ``recipe`` - the published JAX-Toolbox MaxText flag recipe (NVIDIA/JAX-Toolbox
  ``docs/frameworks/maxtext/README.md``), NCCL's own per-call choice;
* ``autoccl`` - every collective tuned alone for its *own* duration (AutoCCL's objective,
  NSDI'25; its code, gbxu/autoccl, times each collective's own kernel): compute beside
  it does not slow a collective in the model, so that is its fastest candidate, whatever
  it costs the compute it overlaps;
* ``lagom`` - start from each of the three above, exactly as they run, and from autoccl
  held to ``Space.floor`` (a collective keeps NCCL's own parameters unless its fastest
  candidate is predicted faster by more than the model's error); from each, tune the
  scheduler, windowed einsum and the combine thresholds; from the two that end shortest,
  rank collectives by priority (their effect on the makespan: exposed time plus the
  compute they slow), tune each in turn over its candidates with the others fixed (a
  change must gain more than ``Space.floor``), then its pipelining; then the overlap
  limit; keep the shortest end, and never one predicted slower than the fastest baseline;
  accept
  only makespan gains. The ring steps of one windowed einsum share one set of params. The work
  is O(N x K) evaluations for N collectives with K candidates each: a collective is
  evaluated on the window of the step it can influence (the whole step when it is small);
* ``exhaustive`` - every combination of per-collective candidates (K^N), under each of
  the xla-default, recipe and no-combining structures and every overlap limit (or only
  the recipe structure with ``Space(tune_structure=False)``), with windowed einsum off
  and on where the step has pairs for it: the optimum under the model of that space, to
  measure lagom's gap; pipelining is not enumerated. Refuses instances
  above ``EXHAUSTIVE_LIMIT`` evaluations.

The package: ``space`` (what may be chosen), ``evaluator`` (the pass pipeline and the
Pareto candidates), ``strategies`` (the five above) and ``results`` (frozen
``SearchResult`` values, cached in memory by graph fingerprint, hardware, strategy and
space).
"""

from .evaluator import Evaluator as Evaluator
from .evaluator import candidates as candidates
from .results import Explanation as Explanation
from .results import SearchResult as SearchResult
from .results import fingerprint as fingerprint
from .space import RECIPE_STRUCTURE as RECIPE_STRUCTURE
from .space import Space as Space
from .space import Structure as Structure
from .space import xla_default_structure as xla_default_structure
from .strategies import EXHAUSTIVE_LIMIT as EXHAUSTIVE_LIMIT
from .strategies import STRATEGIES as STRATEGIES
from .strategies import clear_cache as clear_cache
from .strategies import compare as compare
from .strategies import run_strategy as run_strategy
