"""The commands of ``autograd-guard`` behind ``autograd_guard.cli``: ``check`` (a policy against
the guards), ``doctor`` (the installation), ``report`` (an events file) and ``locate`` (where a
rule's target is defined)."""
