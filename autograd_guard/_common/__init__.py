"""The lowest layer, shared by every other: the process state, the environment variables, the
disk cache, post-import hooks, call sites, the call model (``Call``, ``Target``) and installed
versions. Imports nothing of the package above it (the root's ``errors`` sits beside it)."""

VERSION = "0.1.0"  # ``autograd_guard.__version__``; start plans are keyed by it
