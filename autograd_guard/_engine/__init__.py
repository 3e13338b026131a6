"""The engine: install and uninstall the guards under a policy (``engine``), undo what a
released guard patched (``released``) and report rules no guard used (``unattached``). Above the
guards: it loads them (``autograd_guard.guards``) and starts each one."""
