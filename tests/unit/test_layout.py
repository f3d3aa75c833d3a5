"""The layout keeps its promises: no import cycles, small modules, short functions.

Every import counts, also one inside a function: a lazy import hides a cycle, it does not
remove it. ``from pkg import name`` depends on ``pkg.name`` when that is a module, else on
``pkg`` itself.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("launcher", "resilience", "slurm_plugins")
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 50
MIN_DOCSTRING_CHARS = 30


def _modules() -> dict[str, Path]:
    out = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(parts)] = path
    return out


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    deps = set()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            deps.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(
                    package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else [])
                )
            for alias in node.names:
                deps.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base)
    return {d for d in deps if d in modules and d != name}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_cycles():
    modules = _modules()
    graph = {name: _imports(name, path, modules) for name, path in modules.items()}
    assert _cycles(graph) == []


def test_modules_stay_small():
    big = {n: len(p.read_text().splitlines()) for n, p in _modules().items() if n.split(".")[0] in PACKAGES}
    assert {n: lines for n, lines in big.items() if lines > MAX_MODULE_LINES} == {}


def test_functions_stay_short():
    long = {}
    for name, path in _modules().items():
        if name.split(".")[0] not in PACKAGES:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    long[f"{name}.{node.name}"] = length
    assert long == {}


STORE_CALLS = {
    "set",
    "get",
    "add",
    "check",
    "compare_set",
    "delete_key",
    "multi_get",
    "multi_set",
    "wait",
    "num_keys",
}
STORE_CLASSES = {"TCPStore", "PrefixStore", "HashStore", "FileStore"}


def _a_store(node: ast.expr) -> bool:
    return ast.unparse(node).lower().endswith("store")


def _raw_store_uses(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if (
            isinstance(node, ast.Attribute)
            and node.attr in STORE_CLASSES
            or isinstance(node, ast.Name)
            and node.id in STORE_CLASSES
            or isinstance(node, ast.Attribute)
            and node.attr == "raw"
            and _a_store(node.value)
        ):
            found.append(f"{path.name}:{node.lineno} {ast.unparse(node)}")
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in STORE_CALLS
            and _a_store(node.func.value)
        ):
            found.append(f"{path.name}:{node.lineno} {ast.unparse(node.func)}")
    return found


def test_the_store_is_used_only_through_the_contract():
    """Keys and encodings live in resilience.contract (run_store.RunStore): a key spelled, or a
    value parsed, anywhere else is where two processes start to disagree."""
    raw = {
        name: uses
        for name, path in _modules().items()
        if not name.startswith("resilience.contract") and (uses := _raw_store_uses(path))
    }
    assert raw == {}


ENCODINGS = {"float", "int", "str", "repr", "bytes", "encode", "decode", "dumps", "loads"}


def test_only_the_store_core_encodes_or_calls_the_raw_store():
    """The channels name keys and messages; how a value becomes bytes is StoreCore's alone, so a
    writer and its reader (two processes) cannot encode one value two ways."""
    found = []
    for name, path in _modules().items():
        if not name.startswith("resilience.contract.channels"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            called = node.func if isinstance(node, ast.Call) else None
            called_name = getattr(called, "attr", getattr(called, "id", None))
            if isinstance(node, ast.Attribute) and node.attr in {"raw", "under"} or called_name in ENCODINGS:
                found.append(f"{path.name}:{node.lineno} {ast.unparse(node)}")
            elif isinstance(node, ast.Import | ast.ImportFrom) and "json" in ast.unparse(node):
                found.append(f"{path.name}:{node.lineno} {ast.unparse(node)}")
    assert found == []


def test_the_contract_imports_none_of_the_code_it_describes():
    """Both sides import the contract; it imports neither. Its errors are resilience.errors',
    which the contract may import: a leaf of exception classes (next rule), shared by all."""
    modules = _modules()
    leaks = {}
    for name, path in modules.items():
        if name.startswith("resilience.contract"):
            deps = {d for d in _imports(name, path, modules) if d.split(".")[0] in PACKAGES}
            leaks[name] = sorted(
                d for d in deps if not d.startswith("resilience.contract") and d != "resilience.errors"
            )
    assert {n: d for n, d in leaks.items() if d} == {}


def test_the_errors_modules_are_leaves():
    """One errors.py per package holds its exception classes; each imports only the standard
    library (slurm_plugins.errors also launcher.errors, whose SresError is its base): the
    contract, the Slurm client and the admins' hooks import them without pulling in torch."""
    modules = _modules()
    allowed = {
        "resilience.errors": set(),
        "launcher.errors": set(),
        "slurm_plugins.errors": {"launcher.errors"},
    }
    beyond = {
        name: {d for d in _all_imports(modules[name]) if d.split(".")[0] not in sys.stdlib_module_names} - ok
        for name, ok in allowed.items()
    }
    assert {n: sorted(d) for n, d in beyond.items() if d} == {}


def _all_imports(path: Path) -> set[str]:
    """Every module ``path`` imports, ours or not, also inside a function (``from pkg import
    name``: ``pkg.name`` when that is a module of ours, else ``pkg``)."""
    modules = _modules()
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level:
            for alias in node.names:
                found.add(
                    f"{node.module}.{alias.name}" if f"{node.module}.{alias.name}" in modules else node.module
                )
    return found


def test_admin_hooks_import_from_the_launcher_only_its_slurm_client_and_errors():
    """Hooks run on every node for every job: of the launcher they may use the Slurm client
    (launcher.slurm, torch-free), the errors, ``privileges`` (giving up root for a job's
    user, standard library only) and ``arg_parser`` (one-line usage errors, standard library
    only), nothing that starts or watches ranks."""
    modules = _modules()
    wrong = {}
    for name, path in modules.items():
        if name.split(".")[0] == "slurm_plugins":
            deps = {d for d in _all_imports(path) if d.split(".")[0] == "launcher"}
            allowed = ("launcher.errors", "launcher.privileges", "launcher.arg_parser")
            bad = {d for d in deps if d not in allowed and d.split(".")[:2] != ["launcher", "slurm"]}
            if bad:
                wrong[name] = sorted(bad)
    assert wrong == {}


@pytest.mark.local  # spawns: a fresh interpreter
def test_admin_hooks_and_the_slurm_client_never_import_torch():
    """The prolog and epilog run for every job on every node: importing torch there costs a
    second or more each time. Every slurm_plugins and launcher.slurm module, and every module
    of ours they import anywhere (also inside a function: the epilog's RAM-tier cleanup), is
    imported in a fresh interpreter, which then holds no torch. Only a deep check's own
    ``import torch`` (GPU stress, all-reduce) is left out, being no module of ours."""
    modules = _modules()
    roots = [n for n in modules if n.split(".")[0] == "slurm_plugins" or n.startswith("launcher.slurm")]
    wanted = set(roots)
    for name in roots:
        wanted |= {d for d in _all_imports(modules[name]) if d in modules}
    script = (
        "import importlib, sys\n"
        f"for name in {sorted(wanted)!r}:\n"
        "    importlib.import_module(name)\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'torch'))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]", f"imported: {done.stdout.strip()[:300]}"


@pytest.mark.local  # spawns: a fresh interpreter
def test_the_cli_starts_without_torch_until_a_command_needs_it():
    """``sres status``, ``grow``, ``shrink``, ``report`` and ``ckpt ls`` read files and sockets; the
    tests poll ``sres status`` in loops, and importing torch cost each call 1.5 s of CPU. Only what
    runs a supervisor or a rank (``sres run``, ``srun``, ``demo``) imports it, when it runs; and
    matplotlib (0.4 s) only what draws a page."""
    script = (
        "import sys\n"
        "import launcher.cli, launcher.cli.parser, launcher.supervisor.control\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'matplotlib')))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]", f"imported: {done.stdout.strip()[:300]}"


POLICY = "launcher.supervisor.policy"
"""The folder of the supervisor's pure decisions: every module under it is held to the rule below."""
POLICY_MAY_IMPORT = {
    "launcher.supervisor.observe.view",
    "launcher.supervisor.config",
    "launcher.errors",
    "resilience.contract.messages",
    "resilience.contract.elastic_config",
    "resilience.contract.tier_config",
    "resilience.contract.injections",
    "resilience.contract.slots",
}


def _in_policy(name: str) -> bool:
    return name == POLICY or name.startswith(POLICY + ".")


def test_the_policy_imports_only_the_view_the_actions_and_the_configs():
    """The policy is pure because of what it can reach: the frozen view (which names every value
    type an observation carries), the actions it returns (in its folder), the configs and the
    contract's messages, the other policy modules, launcher.errors (a leaf of exception classes)
    and the standard library. No store, placement, observer, executor or event log. The rule
    holds for the folder: a module put there is checked without being listed."""
    modules = _modules()
    policy = sorted(name for name in modules if _in_policy(name))
    assert f"{POLICY}.decisions" in policy and f"{POLICY}.actions" in policy
    wrong = {}
    for name in policy:
        path = modules[name]
        ours = {d for d in _imports(name, path, modules) if not _in_policy(d)} - POLICY_MAY_IMPORT
        theirs = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                theirs.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and not node.level:
                theirs.add(node.module.split(".")[0])
        theirs -= set(PACKAGES) | set(sys.stdlib_module_names)
        if ours | theirs:
            wrong[name] = sorted(ours | theirs)
    assert wrong == {}


def test_the_view_reads_nothing_of_the_world():
    """The view is the policy's whole input, so it is held to the policy's rule too: it names
    value types of the placement and the straggler detector, never the server, store or
    observer that produce them (a control request is defined in the view for that reason)."""
    modules = _modules()
    name = "launcher.supervisor.observe.view"
    allowed = POLICY_MAY_IMPORT | {"launcher.placement", "launcher.observability.straggler"}
    assert _imports(name, modules[name], modules) - allowed == set()


@pytest.mark.local  # spawns: ruff
def test_ruff_passes():
    """Lines are wrapped by the formatter, never packed to pass a size rule (pyproject: [tool.ruff])."""
    ruff = [sys.executable, "-m", "ruff"]
    for argv in ([*ruff, "check", "--quiet", "."], [*ruff, "format", "--check", "--quiet", "."]):
        done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True)
        assert done.returncode == 0, f"{' '.join(argv[1:])}:\n{done.stdout}{done.stderr}"


def test_every_module_says_what_it_is_for():
    """docs/reference/modules.md is the map of the modules, generated from their docstrings: a
    module without a real first paragraph (30 characters or more) is a room nobody can find.
    Every module of the three packages, ``__init__.py`` and ``__main__.py`` too."""
    short = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            doc = ast.get_docstring(ast.parse(path.read_text())) or ""
            first = " ".join(doc.strip().split("\n\n")[0].split())
            if len(first) < MIN_DOCSTRING_CHARS:
                short[path.relative_to(ROOT).as_posix()] = first
    assert short == {}


def test_architecture_stays_short():
    """ARCHITECTURE.md is the parts, rules, states, words and flows, read whole: under 20 KB.
    What each module is for is docs/reference/modules.md's, generated from the docstrings."""
    assert len((ROOT / "ARCHITECTURE.md").read_bytes()) < 20_000
