"""Flax GPT-2, BERT and T5 with sharding recipes (installed as ``lagom_jax.models``).

>>> built = build("gpt2", "tiny", "dp+tp", "data=2,model=4")
>>> state, batch = built.init(jax.random.key(0))
>>> state, metrics = built.train_step(state, batch)
>>> built.train_step.lower(*built.abstract_inputs).compile()   # no allocation
"""

from __future__ import annotations

from .build import Built as Built
from .build import TrainState as TrainState
from .build import build as build
from .build import default_batch as default_batch
from .families import DEFAULT_CONFIG as DEFAULT_CONFIG
from .families import FAMILIES as FAMILIES
from .layers import ModelConfig as ModelConfig
from .sharding import PART_AXIS as PART_AXIS
from .sharding import make_mesh as make_mesh
from .sharding import parse_mesh as parse_mesh
from .sharding import parse_recipe as parse_recipe

__all__ = ["Built", "DEFAULT_CONFIG", "FAMILIES", "ModelConfig", "PART_AXIS", "TrainState", "build", "make_mesh",
           "parse_mesh", "parse_recipe"]
