"""Everything a guard is made of, for guards shipped by other packages (the built-in
guards use the same names): the contract (``Guard``, ``Target``, ``Call``, ``Option``),
and the helpers the built-in guards read arguments and tensors with.

A third-party guard subclasses ``Guard`` and is declared as an entry point::

    [project.entry-points."autograd_guard.guards"]
    my_guard = "my_package.guards:MyGuard"      # the entry point name is the guard's name

Helpers:

- ``argument(args, kwargs, name, position, default)``: an argument passed by keyword
  or position, the one way to read one (``Call.argument`` for the call in progress);
- ``iter_tensors(value, tensor_type)`` and ``map_tensors(value, tensor_type, change)``:
  the tensors in nested lists, tuples and dicts, and a copy with each one changed;
- ``Snapshot``: copies of tensors, then what changed in them, and their restore;
- ``find_callsite(*packages)``: the user's ``file:line`` outside those packages;
- ``traceable(template, **state)`` and ``remedy_report(guard, target, action, what)``:
  a remedy that ``torch.compile`` traces (``Guard._traced``), and its event.
"""

from autograd_guard._common.call import argument, iter_tensors, map_tensors
from autograd_guard._common.callsite import find_callsite
from autograd_guard._compile.compiled import remedy_report, traceable
from autograd_guard._runtime.guard import Call, Guard, Option, Target
from autograd_guard._runtime.snapshot import Snapshot
from autograd_guard.errors import GuardError

__all__ = [
    "Call",
    "Guard",
    "GuardError",
    "Option",
    "Snapshot",
    "Target",
    "argument",
    "find_callsite",
    "iter_tensors",
    "map_tensors",
    "remedy_report",
    "traceable",
]
