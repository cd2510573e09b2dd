"""moekit._requires — the one-line answer when an optional dependency is missing.

The torch layer (moekit.torch, moekit.stages, moekit.fp8, moekit.hf, moekit.reference, the
benchmark) needs PyTorch; moekit.plot needs matplotlib. Each such module calls require() before
importing the dependency, so a user without it reads what to install, not a traceback from
deep inside an import. Imports nothing of moekit (the package's import graph stays acyclic).
"""
from __future__ import annotations

import importlib.util

__all__ = ["missing", "require"]

# The dependency's import name -> how to install it (the optional-dependency extras of pyproject.toml).
_INSTALL = {
    "torch": "pip install 'moekit[torch]' (or pip install torch)",
    "matplotlib": "pip install 'moekit[plot]' (or pip install matplotlib)",
}


def missing(what: str, dependency: str = "torch") -> str | None:
    """The one-line message when `dependency` is not installed (None when it is): `what` (a module
    or a function, as the user named it) needs it, and the command that installs it."""
    if importlib.util.find_spec(dependency) is not None:
        return None
    name = {"torch": "PyTorch"}.get(dependency, dependency)
    return f"{what} needs {name}, which is not installed: {_INSTALL.get(dependency, f'pip install {dependency}')}"


def require(what: str, dependency: str = "torch") -> None:
    """Raise ModuleNotFoundError with missing()'s message when `dependency` is not installed."""
    why = missing(what, dependency)
    if why is not None:
        raise ModuleNotFoundError(why, name=dependency)
