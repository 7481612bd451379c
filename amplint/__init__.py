"""amplint: find PyTorch automatic-mixed-precision mistakes before they cost a training run."""

__version__ = "0.1.0"
