"""The import graph of python/moekit has no cycle. A CPU test that needs neither PyTorch nor a GPU:
it parses the package's sources and imports none of them.

Every import statement counts, the ones inside functions too: a lazy import still makes the two
modules depend on each other, it only hides the cycle until the first call. An edge goes from a
module to each module of the package it names: `from . import x` to the submodule x when there
is one, else to the package (x is then a name of its __init__); `from .m import y` to m. The
parent package that every submodule import loads first is not an edge (it holds in any package).
"""
import ast
import pathlib

SOURCE = pathlib.Path(__file__).resolve().parents[2] / "python"
PACKAGE = "moekit"
# Compiled modules of the package: python/CMakeLists.txt builds moekit._moekit from
# python/src/bindings.cpp, which imports no Python module of moekit.
EXTENSIONS = {"moekit._moekit"}


def package_modules(root: pathlib.Path, package: str) -> dict:
    """{dotted name: source file} of every Python module of `package` under `root`."""
    out = {}
    for path in sorted((root / package).rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def imported(name: str, path: pathlib.Path, known: set) -> set:
    """The modules in `known` that module `name` (source `path`) imports, anywhere in its body."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level:  # relative: level 1 is this module's package, 2 its parent, ...
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                module = f"{base}.{module}" if module else base
            targets = [f"{module}.{alias.name}" if f"{module}.{alias.name}" in known else module
                       for alias in node.names]
        else:
            continue
        found.update(t for t in targets if t in known and t != name)
    return found


def import_graph(root: pathlib.Path, package: str, extensions=frozenset()) -> dict:
    """{module: the package's modules it imports}; extension modules import none."""
    sources = package_modules(root, package)
    known = set(sources) | set(extensions)
    graph = {name: imported(name, path, known) for name, path in sources.items()}
    graph.update({name: set() for name in extensions})
    return graph


def find_cycle(graph: dict):
    """One cycle of `graph` as [a, b, ..., a], or None when it has none."""
    state = {}  # 1: on the current path, 2: done
    path = []

    def visit(node):
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state:
                cycle = visit(nxt)
                if cycle:
                    return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            cycle = visit(node)
            if cycle:
                return cycle
    return None


def test_moekit_import_graph_has_no_cycle():
    graph = import_graph(SOURCE, PACKAGE, EXTENSIONS)
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle in python/moekit: " + " -> ".join(cycle)


def test_the_graph_sees_lazy_and_relative_imports():
    graph = import_graph(SOURCE, PACKAGE, EXTENSIONS)
    assert "moekit.torch" in graph["moekit"]  # __init__'s function-local import of the torch layer
    assert "moekit.hf" in graph["moekit.torch"]  # torch.py re-exports the packing helpers
    assert "moekit._functional" in graph["moekit.torch"]  # torch.py re-exports the functions
    assert "moekit._moekit" in graph["moekit._functional"]  # `from . import _moekit`: the extension, not __init__
    assert "moekit.torch" not in graph["moekit.hf"]  # hf.py is packing only
    for ext in EXTENSIONS:  # the compiled modules assumed above are the ones the build makes
        assert f"nanobind_add_module({ext.rpartition('.')[2]} " in (SOURCE / "CMakeLists.txt").read_text()


def test_a_function_local_import_closes_a_cycle(tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from .b import g\n")
    (pkg / "b.py").write_text("def g():\n    from .a import f\n    return f\n")
    (pkg / "c.py").write_text("import pkg.a\nfrom pkg import b\n")
    graph = import_graph(tmp_path, "pkg")
    assert graph == {"pkg": set(), "pkg.a": {"pkg.b"}, "pkg.b": {"pkg.a"}, "pkg.c": {"pkg.a", "pkg.b"}}
    assert find_cycle(graph) == ["pkg.a", "pkg.b", "pkg.a"]
    (pkg / "b.py").write_text("def g():\n    return 1\n")
    assert find_cycle(import_graph(tmp_path, "pkg")) is None
