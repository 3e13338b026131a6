"""The policy: finding the file (``files``, on the start path), parsing and checking it
(``schema``, ``options``), the loaded data (``data``, ``policy``) and what happens when it is
unusable (``failure``). Imports only ``_common``, ``_events`` and ``errors``; a guard class is
seen through ``_common.protocols``."""
