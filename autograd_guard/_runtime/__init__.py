"""The runtime every guard builds on: the ``Guard`` base class (``guard``), its reporting half
(``interventions``), the wrappers around a target (``wrapper``, ``proxies``, ``recursion``), the
patches and their undoing (``patching``), the guard contract, input snapshots and CPU re-runs.
The public face of this layer is ``autograd_guard.guard``."""
