"""amplint: find PyTorch automatic-mixed-precision mistakes before they cost a training run."""

import sys

__version__ = "0.1.0"
# What the interpreter had loaded before amplint: `amplint trace` lets the script's own modules
# replace only what amplint imported after this (a local `uuid.py` that `import uuid` finds first).
MODULES_AT_START = frozenset(sys.modules)
