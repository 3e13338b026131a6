"""What a guard is made of, for guards shipped by other packages.

A third-party guard subclasses ``Guard`` and is declared as an entry point::

    [project.entry-points."autograd_guard.guards"]
    my_guard = "my_package.guards:MyGuard"      # the entry point name is the guard's name
"""

from autograd_guard._guard import Call, Guard, Option, Target
from autograd_guard.errors import GuardError

__all__ = ["Call", "Guard", "GuardError", "Option", "Target"]
