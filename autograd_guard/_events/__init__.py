"""Events: what a guard reports (``events``), where the lines go (``sinks``) and how actions
are named and counted (``actions``). Above ``_common`` only: every layer above may emit."""
