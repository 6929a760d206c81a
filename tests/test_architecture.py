"""The layers docs/architecture.md draws, checked: every import points down a layer, modalities and rewards
never import each other, the training core finds adapters and rewards through their registries,
the methods sit above the core behind a wall (the core imports none and names none but through
its registries; no method imports another), no two modules import each other in a circle, and
no source file outgrows one sitting (500 lines) nor any function one screen (80).

Layers, bottom up:
    1  mmrlvr.core, mmrlvr.config, mmrlvr.data, mmrlvr.patches   types, protocols, registry, data
    2  mmrlvr.models, modalities, rewards, mmrlvr.tools            families, adapters, rewards, tools
       (an adapter asks the model's family: modalities may import mmrlvr.models)
    3  mmrlvr.train, mmrlvr.rollout, mmrlvr.algo, mmrlvr.objectives  the training core
    4  mmrlvr.methods (a folder per method)                          the research methods
    5  mmrlvr.stress, mmrlvr.tiny, mmrlvr.tasks, mmrlvr.translate, mmrlvr.compare   tools
    6  mmrlvr.cli*, mmrlvr.api*, apps                              entry points (the package root
       re-exports the Python API lazily: FACADE)
"""
from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("mmrlvr", "modalities", "rewards", "apps")
LAYERS = {
    "mmrlvr": 1, "mmrlvr.core": 1, "mmrlvr.config": 1, "mmrlvr.data": 1, "mmrlvr.patches": 1,
    "mmrlvr.models": 2, "modalities": 2, "rewards": 2, "mmrlvr.tools": 2,
    "mmrlvr.train": 3, "mmrlvr.rollout": 3, "mmrlvr.algo": 3, "mmrlvr.objectives": 3,
    "mmrlvr.methods": 4,
    "mmrlvr.stress": 5, "mmrlvr.tiny": 5, "mmrlvr.tasks": 5, "mmrlvr.translate": 5,
    "mmrlvr.compare": 5, "mmrlvr.audit": 5,
    "mmrlvr.cli": 6, "mmrlvr.cli_args": 6, "mmrlvr.cli_check": 6, "mmrlvr.api": 6, "mmrlvr.api_data": 6,
    "mmrlvr.api_rewards": 6, "mmrlvr.api_eval": 6, "mmrlvr.api_config": 6, "apps": 6,
}
FACADE = ("mmrlvr", "mmrlvr.api")
"""The one upward import allowed: the package root re-exports the Python API (`from mmrlvr import
GRPOTrainer`), lazily, in its `__getattr__`, so `import mmrlvr` imports nothing of it."""
CORE = 3
METHODS = "mmrlvr.methods"
CORE_MAY_IMPORT = {"modalities", "rewards", "rewards.verify", "mmrlvr.models", "mmrlvr.tools"}
"""What layer 3 may import from layer 2: the registries (package roots: adapters, rewards, model
families) and the verifier's public API (README, "The verifier": `rewards.verify.extract_answer` / `match`)."""
PLUGIN_TABLE = "mmrlvr.core.registry"
"""The one core module that names the methods' package (`PLUGINS`: imported to register them)."""
MAX_LINES = 500
MAX_FUNCTION_LINES = 80
"""A function, from its `def` to its last line (docstring and decorators' arguments included)."""


def layer_of(module: str) -> int:
    prefix = max((p for p in LAYERS if module == p or module.startswith(p + ".")), key=len)
    return LAYERS[prefix]


def modules() -> dict[str, Path]:
    out = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


def imports(path: Path, known: set[str]) -> list[tuple[str, int]]:
    """Our modules imported anywhere in the file (function bodies too), with line numbers."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            # `from pkg import sub` imports the module pkg.sub where one exists
            subs = [f"{node.module}.{a.name}" for a in node.names if f"{node.module}.{a.name}" in known]
            names = subs or [node.module]
        for name in names:
            if name.split(".")[0] in PACKAGES:
                while name not in known and "." in name:       # an attribute, not a module
                    name = name.rsplit(".", 1)[0]
                found.append((name, node.lineno))
    return found


def test_every_import_points_down_a_layer():
    mods = modules()
    wrong = []
    for src, path in sorted(mods.items()):
        ls = layer_of(src)
        for target, line in imports(path, set(mods)):
            lt = layer_of(target)
            same_room = target.split(".")[0] == src.split(".")[0]
            family = src.split(".")[0] == "modalities" and target.startswith("mmrlvr.models")
            if (src, target) == FACADE:
                continue
            if lt > ls or (lt == ls == 2 and not same_room and not family):
                wrong.append(f"{path.relative_to(ROOT)}:{line}: {src} (layer {ls}) imports "
                             f"{target} (layer {lt})")
            elif ls == CORE and lt == 2 and target not in CORE_MAY_IMPORT:
                wrong.append(f"{path.relative_to(ROOT)}:{line}: {src} (the core) imports "
                             f"{target}; reach adapters and rewards through their registries")
    assert not wrong, "imports across the layers the wrong way:\n" + "\n".join(wrong)


def test_no_module_imports_itself_in_a_circle():
    mods = modules()
    graph = defaultdict(set)
    for src, path in mods.items():
        for target, _ in imports(path, set(mods)):
            if target != src and not src.startswith(target + "."):   # a package's own __init__
                graph[src].add(target)
    cycles, state = [], {}

    def visit(node: str, stack: list[str]) -> None:
        state[node] = "open"
        for nxt in sorted(graph[node]):
            if state.get(nxt) == "open":
                cycles.append(" -> ".join(stack[stack.index(nxt):] + [nxt]))
            elif nxt not in state:
                visit(nxt, stack + [nxt])
        state[node] = "done"

    for node in sorted(mods):
        if node not in state:
            visit(node, [node])
    assert not cycles, "modules that import each other in a circle:\n" + "\n".join(cycles)


def test_no_source_file_outgrows_one_sitting():
    long = [f"{p.relative_to(ROOT)}: {n} lines" for p in modules().values()
            if (n := len(p.read_text().splitlines())) > MAX_LINES]
    assert not long, f"files over {MAX_LINES} lines (split them along their sections):\n" + \
        "\n".join(long)


def test_no_function_outgrows_one_screen():
    long = [f"{p.relative_to(ROOT)}:{node.lineno}: {node.name}, {n} lines"
            for p in modules().values() for node in ast.walk(ast.parse(p.read_text(), str(p)))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and (n := node.end_lineno - node.lineno + 1) > MAX_FUNCTION_LINES]
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines (split them into named parts):\n" + \
        "\n".join(long)


def test_the_layer_map_covers_every_module():
    unmapped = [m for m in modules() if not any(m == p or m.startswith(p + ".") for p in LAYERS)]
    assert not unmapped


def method_of(module: str) -> str | None:
    """The method folder a module belongs to (`mmrlvr.methods.NAME...` -> NAME), else None."""
    parts = module.split(".")
    return parts[2] if module.startswith(METHODS + ".") and len(parts) > 2 else None


def test_no_method_imports_another_method():
    mods = modules()
    wrong = [f"{path.relative_to(ROOT)}:{line}: {src} imports {target}"
             for src, path in sorted(mods.items()) if method_of(src)
             for target, line in imports(path, set(mods))
             if method_of(target) and method_of(target) != method_of(src)]
    assert not wrong, "methods importing each other (share through the core instead):\n" + \
        "\n".join(wrong)


def test_the_core_names_no_method_but_through_its_plugin_table():
    """No string of the core (layers 1-3) names a method module: the methods register themselves
    (`mmrlvr.methods`), and only `mmrlvr.core.registry.PLUGINS` names their package."""
    wrong = []
    for src, path in sorted(modules().items()):
        if layer_of(src) > CORE or src == PLUGIN_TABLE:
            continue
        tree = ast.parse(path.read_text(), str(path))
        docstrings = {id(node.value) for node in ast.walk(tree)       # prose: docs, not code
                      if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) \
                    and id(node) not in docstrings and METHODS in node.value:
                wrong.append(f"{path.relative_to(ROOT)}:{node.lineno}: {node.value!r}")
    assert not wrong, "core code naming a method (register it from its folder):\n" + "\n".join(wrong)


def test_every_method_folder_is_registered_and_documents_its_switch():
    import mmrlvr.methods as methods

    folders = sorted(p.name for p in (ROOT / "mmrlvr" / "methods").iterdir()
                     if p.is_dir() and (p / "__init__.py").exists())
    assert folders == sorted(methods.METHODS)
    for name in folders:
        doc = ast.get_docstring(ast.parse((ROOT / "mmrlvr/methods" / name / "__init__.py").read_text()))
        assert doc and "off" in doc.lower(), f"mmrlvr/methods/{name}/__init__.py: say how it is switched off"
