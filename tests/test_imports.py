"""morphguard's import graph has no cycle: every import counts, at module level or inside a function, and those
under `if TYPE_CHECKING:` too (an annotation that needs a module above is a layering fault all the same)."""

from __future__ import annotations

import ast
from pathlib import Path

import morphguard

ROOT = Path(morphguard.__file__).parent

def _modules() -> dict[str, Path]:
    out = {}
    for path in ROOT.rglob("*.py"):
        parts = ("morphguard", *path.relative_to(ROOT).with_suffix("").parts)
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The morphguard modules `name` imports: `from p import x` is module p.x where that is a module, else p."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            for alias in node.names:
                found.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base)
    return {m for m in found if m in known and m != name}


def _graph() -> dict[str, set[str]]:
    known = _modules()
    return {name: _imports(name, path, known) for name, path in known.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan's algorithm, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            child = next(edges, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_the_graph_is_read_whole():
    graph = _graph()
    assert "morphguard.proxy.app" in graph["morphguard.server"]  # a function-level import
    assert "morphguard.proxy.flow" in graph["morphguard.proxy.app"]
    assert "morphguard.store.queue" in graph["morphguard.store.redis_queue"]


def test_cycles_are_found():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_module_imports_itself_back():
    cycles = _cycles(_graph())
    assert cycles == [], "import cycles: " + "; ".join(" <-> ".join(c) for c in cycles)


def _attributes(module: str) -> set[str]:
    """The attribute names `module` reads off any object (`x.engine` reads `engine`)."""
    path = _modules()[module]
    return {node.attr for node in ast.walk(ast.parse(path.read_text(), str(path))) if isinstance(node, ast.Attribute)}


def test_stream_modes_run_the_flows_steps_and_never_the_guards_parts():
    """A stream mode asks the request path for its steps (`proxy.exchange.Steps`): it imports neither the guard nor
    what the guard is made of, and reaches into no object for them."""
    graph = _graph()
    for module in ("morphguard.proxy.stream_modes", "morphguard.proxy.exchange"):
        assert not graph[module] & {"morphguard.settle.guard", "morphguard.settle.check", "morphguard.settle.trail",
                                    "morphguard.proxy.flow"}, module
    assert not _attributes("morphguard.proxy.stream_modes") & {"guard", "engine", "checker", "config", "settings",
                                                               "backend"}


def test_integrations_sit_above_the_proxy_and_only_the_server_hands_it_their_webhooks():
    """What runs inside or beside other frameworks may use the request path; nothing of the proxy or below imports
    them: the served app is composed above both (`morphguard.server` hands the proxy Portkey's webhook). The client
    helpers run in apps behind the proxy and import nothing of morphguard but each other."""
    graph = _graph()
    into = {module for module, imports in graph.items() if not module.startswith("morphguard.integrations")
            and any(imported.startswith("morphguard.integrations") for imported in imports)}
    assert into == {"morphguard.server"}
    assert "morphguard.integrations.portkey" in graph["morphguard.server"]
    assert not graph["morphguard.integrations.portkey"] & {"morphguard.proxy.app", "morphguard.proxy.check_api",
                                                            "morphguard.server"}
    helpers = [module for module in graph if module.startswith("morphguard.integrations.clients")]
    assert len(helpers) == 3
    for module in helpers:
        assert all(imported.startswith("morphguard.integrations.clients") for imported in graph[module]), module


def test_fair_shares_and_thread_lanes_sit_on_the_lowest_floor():
    """The detectors, the judge's client and the proxy share them for reasons of their own: they import nothing of
    morphguard but each other (the lanes take their turns from the fair shares)."""
    graph = _graph()
    assert graph["morphguard.fairness"] == set()
    assert graph["morphguard.lanes"] == {"morphguard.fairness"}


# What the HTTP edge, a worker and the plug-ins may import of the settle side: its face, the values that cross it, and
# for a stream mode, the engine it runs and what the face hands a stream (`Streaming`: the engine with its checks).
SETTLE_FACE = {"morphguard.settle", "morphguard.settle.guard", "morphguard.settle.values",
               "morphguard.settle.incremental", "morphguard.settle.stream_checks"}
# The face's parts, which no caller reads off it.
_PARTS = {"checker", "_checker", "_settler", "_trail", "_later", "_consumer"}


def _outside_settle() -> list[str]:
    return [name for name in _modules() if name.startswith(("morphguard.proxy", "morphguard.integrations"))
            or name == "morphguard.worker"]


def _packages_imported(path: Path) -> set[str]:
    """Every module `path` names in an import statement, as written (absolute imports only)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            found.add(node.module)
    return found


def test_the_edge_asks_the_settle_side_through_its_face_alone():
    graph = _graph()
    for module in _outside_settle():
        reached = {m for m in graph[module] if m.startswith("morphguard.settle")}
        assert reached <= SETTLE_FACE, f"{module} imports {sorted(reached - SETTLE_FACE)}"
        assert not _attributes(module) & _PARTS, f"{module} reads {sorted(_attributes(module) & _PARTS)}"


def test_the_settle_side_sits_below_the_http_edge():
    graph = _graph()
    settle = [name for name in _modules() if name.startswith("morphguard.settle")]
    assert len(settle) > 5
    for module in settle:
        assert not {m for m in graph[module] if m.startswith(("morphguard.proxy", "morphguard.integrations"))
                    or m in ("morphguard.worker", "morphguard.cli")}, module
        assert not {m for m in _packages_imported(_modules()[module]) if m.split(".")[0] == "starlette"}, module


def test_the_face_rules_fail_on_a_reach_past_the_face(tmp_path):
    """The checks above can fail: a module of the edge that imports a part, or a settle module that imports Starlette,
    is seen."""
    edge = tmp_path / "edge.py"
    edge.write_text("from morphguard.settle.trail import Trail\nfrom starlette.responses import Response\n"
                    "def f(guard):\n    return guard.checker\n")
    assert "morphguard.settle.trail" in _imports("morphguard.proxy.edge", edge, _modules())
    assert "starlette.responses" in _packages_imported(edge)
    assert "checker" in {node.attr for node in ast.walk(ast.parse(edge.read_text())) if isinstance(node, ast.Attribute)}


def test_policy_decides_and_the_proxy_does_not():
    """One decision: only the policy engine makes a `Decision` of a check, and the proxy's and the settle side's modules
    ask it (`decide`) rather than carry a rule of their own; an answer of several choices is decided once (no module
    that settles them asks the engine beside the settler and the trail)."""
    graph = _graph()
    assert "morphguard.settle.guard" not in graph["morphguard.settle.check"]
    for module in ("morphguard.settle.check", "morphguard.proxy.stream_modes", "morphguard.settle.incremental",
                   "morphguard.settle.stream_checks", "morphguard.proxy.flow", "morphguard.settle.choices",
                   "morphguard.proxy.choices", "morphguard.integrations.portkey", "morphguard.proxy.check_api",
                   "morphguard.integrations.litellm"):
        path = _modules()[module]
        calls = {node.func.id for node in ast.walk(ast.parse(path.read_text(), str(path)))
                 if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)}
        assert "Decision" not in calls, module  # no Decision is built outside the engine
        assert "rule" not in _attributes(module), module  # no rule read to act on, beside the engine's decision
    for module in ("morphguard.settle.check", "morphguard.settle.trail"):
        assert not _attributes(module) & {"rule", "unreadable_output"}, module
    assert "engine" not in _attributes("morphguard.settle.choices")  # decided by the settler or the trail, once
    changed = [name for name in _modules() if name != "morphguard.policy.engine" and _changes_action(name)]
    assert changed == [], f"the action is changed after policy decided, in {changed}"


def _changes_action(module: str) -> bool:
    """Whether `module` copies a model with its `action` changed (`x.model_copy(update={"action": ...})`)."""
    path = _modules()[module]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "model_copy":
            for keyword in node.keywords:
                if keyword.arg == "update" and isinstance(keyword.value, ast.Dict) and any(
                        isinstance(k, ast.Constant) and k.value == "action" for k in keyword.value.keys):
                    return True
    return False


def _imported_by(code: str) -> set[str]:
    """The modules a fresh interpreter holds after running `code` (which prints nothing)."""
    import json
    import os
    import subprocess
    import sys

    env = {**os.environ, "PYTHONPATH": str(ROOT.parent)}
    run = subprocess.run([sys.executable, "-c", code + "\nimport sys, json; print(json.dumps(sorted(sys.modules)))"],
                         capture_output=True, text=True, env=env, timeout=120, check=True)
    return set(json.loads(run.stdout.splitlines()[-1]))


# What a check needs and a config does not: slow to import, so never loaded by reading a config.
_HEAVY = ("litellm", "numpy", "opentelemetry", "httpx", "aiohttp", "starlette", "sqlalchemy", "redis", "yaml", "rich",
          "asyncio")


def test_importing_the_config_loads_no_other_layer_and_nothing_heavy():
    modules = _imported_by("import morphguard.config")
    ours = {m for m in modules if m.startswith("morphguard")}
    assert ours == {"morphguard", "morphguard.config", "morphguard.errors"}
    assert not {m for m in modules if m.split(".")[0] in _HEAVY}


def test_the_packages_public_names_load_on_first_use():
    modules = _imported_by("import morphguard\nfrom morphguard import Config, Detection, RagInput, detect, adetect")
    assert "morphguard.models" in modules and "morphguard.detectors" not in modules and "litellm" not in modules
    import morphguard as package

    for name in package.__all__:
        assert getattr(package, name) is not None
    assert "Detection" in dir(package)


def test_the_old_names_of_a_judgment_and_of_the_detection_cache_still_work_and_warn():
    import importlib
    import sys

    import pytest

    import morphguard
    from morphguard.models import Judgment
    from morphguard.store.detections import DetectionCache

    with pytest.warns(DeprecationWarning, match="Judgment"):
        assert morphguard.Verdict is Judgment
    with pytest.warns(DeprecationWarning, match="Judgment"):
        from morphguard.models import Verdict
    assert Verdict.NOT_SURE is Judgment.NOT_SURE
    sys.modules.pop("morphguard.store.verdicts", None)
    with pytest.warns(DeprecationWarning, match="store.detections"):
        old = importlib.import_module("morphguard.store.verdicts")
    assert old.VerdictCache is DetectionCache
