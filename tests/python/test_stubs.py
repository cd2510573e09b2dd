"""python/moekit/_moekit.pyi against the extension it describes: the same public names, the same
class members, and per function the same parameters (names, which are keyword-only, which have
defaults), read from nanobind's own signatures (__nb_signature__). A CPU test: it imports the
module, which needs no GPU. The package ships the stub and py.typed (PEP 561)."""
import ast
import pathlib

import pytest

import moekit
from moekit import _moekit as C

PACKAGE = pathlib.Path(moekit.__file__).parent
SOURCE = pathlib.Path(__file__).resolve().parents[2] / "python" / "moekit"
STUB_ONLY = {"DLPackArray"}  # the stub's own alias for array arguments


def stub_tree(root: pathlib.Path) -> ast.Module:
    return ast.parse((root / "_moekit.pyi").read_text())


def stub_names(tree: ast.Module) -> dict:
    """{top-level name: node} of the stub (functions, classes, annotated constants)."""
    out = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            out[node.name] = node
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            out[node.target.id] = node
    return {k: v for k, v in out.items() if k not in STUB_ONLY}


def params(fn: ast.FunctionDef) -> tuple:
    """(positional names, keyword-only names, names with a default) of a def."""
    a = fn.args
    positional = [p.arg for p in a.posonlyargs + a.args]
    with_default = positional[len(positional) - len(a.defaults):] if a.defaults else []
    kwonly = [p.arg for p in a.kwonlyargs]
    with_default += [p.arg for p, d in zip(a.kwonlyargs, a.kw_defaults) if d is not None]
    return positional, kwonly, sorted(with_default)


def binding_params(obj) -> tuple:
    """params() of a nanobind function, from its signature string (defaults appear as \\N)."""
    sig = obj.__nb_signature__[0][0].replace("\\", "_")  # `= \\0` -> `= _0`: a valid default expression
    fn = ast.parse(sig + ": ...").body[0]
    return params(fn)


@pytest.mark.parametrize("root", [PACKAGE, SOURCE], ids=["installed", "source"])
def test_stub_is_shipped_with_py_typed(root):
    assert (root / "_moekit.pyi").is_file() and (root / "py.typed").is_file()


def test_stub_has_the_modules_names():
    names = stub_names(stub_tree(SOURCE))
    public = {n for n in dir(C) if not n.startswith("_")} | {"__version__"}
    assert set(names) == public, f"only in the module: {sorted(public - set(names))}; " \
                                 f"only in the stub: {sorted(set(names) - public)}"


def test_stub_functions_have_the_bindings_parameters():
    names = stub_names(stub_tree(SOURCE))
    checked = 0
    for name, node in names.items():
        if isinstance(node, ast.FunctionDef):
            assert params(node) == binding_params(getattr(C, name)), name
            checked += 1
    assert checked >= 15


@pytest.mark.parametrize("cls", ["DeviceInfo", "Plan", "BackwardPlan"])
def test_stub_classes_have_the_bindings_members(cls):
    node = stub_names(stub_tree(SOURCE))[cls]
    members = {}
    for item in node.body:
        if isinstance(item, ast.FunctionDef) and not any(
                isinstance(d, ast.Attribute) and d.attr == "setter" for d in item.decorator_list):
            members[item.name] = item
    real = {n for n in vars(getattr(C, cls)) if not n.startswith("__")}
    assert {n for n in members if not n.startswith("__")} == real
    for name, item in members.items():
        obj = getattr(getattr(C, cls), name)
        if hasattr(obj, "__nb_signature__"):  # methods (properties are checked by name)
            assert params(item) == binding_params(obj), f"{cls}.{name}"


def test_exceptions_in_the_stub_match():
    names = stub_names(stub_tree(SOURCE))
    for name, base in (("Error", ValueError), ("CudaError", RuntimeError)):
        assert issubclass(getattr(C, name), base)
        assert [b.id for b in names[name].bases] == [base.__name__]
