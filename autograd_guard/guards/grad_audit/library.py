"""grad_audit's library call behind a gradient "injector": found on the stack, to call again.

An optimal-transport library computes a loss and its gradient itself (in NumPy, by a
solver) and hands both to torch through a Function whose forward returns the value and
whose backward returns the precomputed gradient (POT's ``set_gradients``). Perturbing
that Function's inputs changes nothing, so it cannot be judged by itself; the library
call that computed the value can. It is the outermost frame of the injector's own
package below the caller's code (``ot.gromov_wasserstein2``, not the helper inside it
that calls the injector): a function defined at the top level of its module, found by
its name there, called again with the values its parameters hold in that frame.

A parameter the function has since rebound to another value (``M, a, b =
nx.to_numpy(M, a, b)`` in POT's ``emd2``) is recognised where it holds the values of
exactly one of the injector's inputs (its NumPy copy, say): the input is passed in its
place. A parameter that holds anything but a value (a module, a generator, a list, an
array of unknown origin) means the call is not re-run, and so does a call asked to print
its progress (``verbose``). Only an installed library is re-called, never the program's
own code; what the library function does through globals (a callback registered with it,
a data stream it reads) runs again at each re-call (documented). Each call gets fresh
copies of the tensor arguments. A re-run that does not give the injected value again at
the same point is not judged (``injected``).
"""

from __future__ import annotations

import inspect
import os
import sys

from autograd_guard.guards.grad_audit.rerun import plain

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from types import FrameType
    from typing import Any

VARARGS, VARKEYWORDS = 0x04, 0x08  # code flags
OWN = ("autograd_guard", "torch")  # frames between the injector's call and its library
VERBOSE = ("verbose", "disp")  # a call asked to print: a re-call would print again


class LibraryCall:
    """The library function and its arguments; ``inputs`` maps a place in the call
    (("args", i), ("kwargs", name)) to the injector's tensor argument it holds."""

    def __init__(
        self,
        function: Callable[..., Any],
        args: list[Any],
        kwargs: dict[str, Any],
        inputs: dict[tuple[str, Any], int],
    ) -> None:
        self.function, self.args, self.kwargs, self.inputs = function, args, kwargs, inputs

    @property
    def name(self) -> str:
        function = self.function
        return f"{function.__module__}.{function.__qualname__}"

    def place_of(self, index: int) -> str:
        """The parameter that holds the injector's ``index``-th tensor argument."""
        for (kind, key), held in self.inputs.items():
            if held == index:
                return key if kind == "kwargs" else self._parameter(key)
        return str(index)

    def _parameter(self, position: int) -> str:
        names = self.function.__code__.co_varnames[: self.function.__code__.co_argcount]
        return names[position] if position < len(names) else f"*args[{position - len(names)}]"

    def call(self, changes: dict[int, Any]) -> Any:
        """The function's result with the injector's tensor arguments in ``changes``
        replaced (by index)."""
        args, kwargs = (
            [_fresh(a) for a in self.args],
            {k: _fresh(v) for k, v in self.kwargs.items()},
        )
        for (kind, key), index in self.inputs.items():
            if index in changes:
                if kind == "args":
                    args[key] = changes[index]
                else:
                    kwargs[key] = changes[index]
        return self.function(*args, **kwargs)


def _fresh(value: Any) -> Any:
    """A copy of a tensor argument for one call (the library may write what it is given)."""
    tensor = sys.modules["torch"].Tensor
    return value.clone() if isinstance(value, tensor) else value


def find(package: str, tensors: list[Any]) -> LibraryCall | str:
    """The outermost call of ``package`` on the stack, with its arguments copied (the
    injector's ``tensors`` mapped to their places), or why there is none to re-run."""
    if not installed(package):
        return f"{package} is not an installed library (the program's own code is not re-run)"
    frame = _outermost(sys._getframe(1), package)
    if frame is None:
        return "its library called it from no function of its own"
    function = _function_of(frame)
    if function is None:
        return f"its library call ({frame.f_code.co_name}) is not a module-level function"
    local = dict(frame.f_locals)
    found = _arguments(frame.f_code, local)
    if found is None:
        return f"{frame.f_code.co_name} rebinds or deletes a parameter's name"
    if any(isinstance(local.get(n), (bool, int)) and local.get(n) for n in VERBOSE):
        return f"{frame.f_code.co_name} was asked to print its progress (verbose)"
    return _mapped(function, *found, tensors)


def installed(package: str) -> bool:
    """``package`` is a library: a distribution installed it (its metadata names the
    package), and it is in a site-packages folder or outside the program's own folders
    (the working directory, the main script's: an editable install of the program)."""
    found = _INSTALLED.get(package)
    if found is None:
        found = _INSTALLED[package] = _installed(package)
    return found


_INSTALLED: dict[str, bool] = {}


def _installed(package: str) -> bool:
    module = sys.modules.get(package)
    path = os.path.realpath(getattr(module, "__file__", None) or "")
    if not path or package == "__main__":
        return False
    folder = os.path.dirname(os.path.dirname(path))  # above the package's own folder
    if not _has_metadata(folder, package):
        return False
    if "site-packages" in path or "dist-packages" in path:
        return True
    main = getattr(sys.modules.get("__main__"), "__file__", None)
    own = [os.getcwd(), *([os.path.dirname(os.path.realpath(main))] if main else [])]
    return not any(path.startswith(os.path.join(os.path.realpath(d), "")) for d in own)


def _has_metadata(folder: str, package: str) -> bool:
    """A ``*.dist-info`` (or ``*.egg-info``) in ``folder`` names ``package`` as its own:
    in its ``top_level.txt``, else in its ``RECORD`` (read only where needed)."""
    try:
        names = [n for n in os.listdir(folder) if n.endswith((".dist-info", ".egg-info"))]
    except OSError:
        return False
    for listing in ("top_level.txt", "RECORD"):
        for name in names:
            try:
                with open(os.path.join(folder, name, listing), encoding="utf-8") as file:
                    if any(_owns(listing, line, package) for line in file):
                        return True
            except OSError:
                continue
    return False


def _owns(listing: str, line: str, package: str) -> bool:
    if listing == "RECORD":
        return line.startswith(package + "/")
    return line.strip() == package


def _outermost(frame: FrameType | None, package: str) -> FrameType | None:
    """The last frame of ``package`` in the run of its frames above the guard's own."""
    while frame is not None and _package(frame) in OWN:
        frame = frame.f_back
    found = None
    while frame is not None and _package(frame) == package:
        found, frame = frame, frame.f_back
    return found


def _package(frame: FrameType) -> str:
    return str(frame.f_globals.get("__name__", "")).partition(".")[0]


def _function_of(frame: FrameType) -> Any:
    code = frame.f_code
    candidate = frame.f_globals.get(code.co_name)
    try:
        function = inspect.unwrap(candidate) if callable(candidate) else None
    except ValueError:  # a cycle of __wrapped__
        return None
    if getattr(function, "__code__", None) is not code:
        return None
    return candidate  # as the caller calls it (decorators included)


def _arguments(code: Any, local: dict[str, Any]) -> tuple[list[Any], dict[str, Any]] | None:
    """The positional and keyword arguments the frame's parameters hold now."""
    count, kwonly = code.co_argcount, code.co_kwonlyargcount
    names = code.co_varnames
    extra = count + kwonly
    try:
        args = [local[name] for name in names[:count]]
        kwargs = {name: local[name] for name in names[count:extra]}
        if code.co_flags & VARARGS:
            args += list(local[names[extra]])
            extra += 1
        if code.co_flags & VARKEYWORDS:
            kwargs.update(dict(local[names[extra]]))
    except (KeyError, TypeError):
        return None
    return args, kwargs


def _mapped(
    function: Any, args: list[Any], kwargs: dict[str, Any], tensors: list[Any]
) -> LibraryCall | str:
    """Each argument: one of the injector's tensors (by identity, else by its values),
    or a value copied; anything else: why not."""
    torch = sys.modules["torch"]
    inputs: dict[tuple[str, Any], int] = {}
    places: list[tuple[tuple[str, Any], Any]] = [(("args", i), v) for i, v in enumerate(args)]
    places += [(("kwargs", k), v) for k, v in kwargs.items()]
    for place, value in places:
        index = _held(torch, value, tensors, set(inputs.values()))
        if isinstance(index, str):
            return f"{function.__name__}'s argument {place[1]} {index}"
        if index is not None:
            inputs[place] = index
            value = None  # passed at each call: the injector's input, or a perturbed copy
        elif not plain(torch, value):
            return f"{function.__name__}'s argument {place[1]} is not a value"
        else:
            value = value.detach().clone() if isinstance(value, torch.Tensor) else value
        if place[0] == "args":
            args[place[1]] = value
        else:
            kwargs[place[1]] = value
    return LibraryCall(function, args, kwargs, inputs)


def _held(torch: Any, value: Any, tensors: list[Any], taken: set[int]) -> int | str | None:
    """The index of the injector's tensor ``value`` is, or holds the values of (where
    that is not ambiguous for a tensor requiring grad); None for another value."""
    for index, tensor in enumerate(tensors):
        if value is tensor:
            return index
    shape = getattr(value, "shape", None)
    if shape is None or isinstance(value, (int, float)):
        return None
    same = [
        i
        for i, t in enumerate(tensors)
        if i not in taken and tuple(t.shape) == tuple(shape) and _equal_values(torch, value, t)
    ]
    if not same:
        return None if isinstance(value, torch.Tensor) else "holds an array of unknown origin"
    if len(same) > 1 and any(tensors[i].requires_grad for i in same):
        return "holds values of two of the injected inputs"
    return same[0]


def _equal_values(torch: Any, value: Any, tensor: Any) -> bool:
    try:
        other = torch.as_tensor(value).to(torch.float64)
    except Exception:
        return False
    mine = tensor.detach().to(torch.float64).cpu()
    return bool(torch.allclose(other.cpu(), mine, rtol=1e-6, atol=0.0))
