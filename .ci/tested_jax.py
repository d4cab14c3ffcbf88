"""Print the oldest or newest JAX release lagom-jax is tested with (``oldest`` | ``newest``).

Read from ``CHECKED_JAX`` in lagom_jax/program/jax_internals.py without importing it, so that CI
can pin the JAX it installs before anything is installed.
"""

import ast
import pathlib
import sys

source = pathlib.Path(__file__).resolve().parents[1] / "lagom_jax" / "program" / "jax_internals.py"
tree = ast.parse(source.read_text())
checked = next(ast.literal_eval(node.value) for node in tree.body
               if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == "CHECKED_JAX")
print({"oldest": checked[0], "newest": checked[-1]}[sys.argv[1]])
