"""The layers docs/architecture.md draws, checked: every import points down a layer, modalities and rewards
never import each other, the training core finds adapters and rewards through their registries,
no two modules import each other in a circle, and no source file outgrows one sitting.

Layers, bottom up:
    1  mmrlvr.core, mmrlvr.config, mmrlvr.data, mmrlvr.patches   types, protocols, registry, data
    2  mmrlvr.models, modalities, rewards                          families, adapters, rewards
       (an adapter asks the model's family: modalities may import mmrlvr.models)
    3  mmrlvr.train, mmrlvr.rollout, mmrlvr.algo, mmrlvr.objectives  the training core
    4  mmrlvr.stress, mmrlvr.tiny, mmrlvr.tasks, mmrlvr.translate, mmrlvr.compare   tools
    5  mmrlvr.cli, apps                                            entry points
"""
from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("mmrlvr", "modalities", "rewards", "apps")
LAYERS = {
    "mmrlvr": 1, "mmrlvr.core": 1, "mmrlvr.config": 1, "mmrlvr.data": 1, "mmrlvr.patches": 1,
    "mmrlvr.models": 2, "modalities": 2, "rewards": 2,
    "mmrlvr.train": 3, "mmrlvr.rollout": 3, "mmrlvr.algo": 3, "mmrlvr.objectives": 3,
    "mmrlvr.stress": 4, "mmrlvr.tiny": 4, "mmrlvr.tasks": 4, "mmrlvr.translate": 4,
    "mmrlvr.compare": 4, "mmrlvr.audit": 4,
    "mmrlvr.cli": 5, "apps": 5,
}
CORE_MAY_IMPORT = {"modalities", "rewards", "rewards.verify", "mmrlvr.models"}
"""What layer 3 may import from layer 2: the registries (package roots: adapters, rewards, model
families) and the verifier's public API (README, "The verifier": `rewards.verify.extract_answer` / `match`)."""
MAX_LINES = 500


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
            if lt > ls or (lt == ls == 2 and not same_room and not family):
                wrong.append(f"{path.relative_to(ROOT)}:{line}: {src} (layer {ls}) imports "
                             f"{target} (layer {lt})")
            elif ls == 3 and lt == 2 and target not in CORE_MAY_IMPORT:
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


def test_the_layer_map_covers_every_module():
    unmapped = [m for m in modules() if not any(m == p or m.startswith(p + ".") for p in LAYERS)]
    assert not unmapped
