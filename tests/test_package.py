"""The package's shape: it never imports its benchmark, and its modules import each other without a cycle."""

import ast
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pacer_core
import pacer_hf

PACKAGE = Path(pacer_hf.__file__).parent
CORE = Path(pacer_core.__file__).parent


def test_importing_the_library_and_building_its_cli_never_imports_the_harness():
    code = ("import sys, pacer_hf; from pacer_hf.cli import build_parser; build_parser(); "
            "print([m for m in sys.modules if m == 'eval' or m.startswith('eval.')])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def _external_imports(path: Path) -> set[str]:
    """The top-level packages that `path` imports (function-local imports included), less the standard library."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names - set(sys.stdlib_module_names)


def test_pacer_core_needs_only_torch_safetensors_the_hub_client_and_jinja():
    """What a serving engine (vLLM) loads to stop its drafts with a PACER head: never transformers, whose version
    such an engine pins elsewhere, nor pacer_hf's generate() route."""
    needed = set().union(*(_external_imports(path) for path in CORE.glob("*.py")))
    assert needed == {"torch", "safetensors", "huggingface_hub"}  # Jinja2: through huggingface_hub's card templates
    code = ("import sys, pacer_core; from pacer_core import PacerHead, says_stop; "
            "print(sorted(m for m in ('transformers', 'pacer_hf', 'accelerate') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_pacer_hf_re_exports_the_core_it_is_built_on():
    import pacer_core

    assert pacer_hf.PacerHead is pacer_core.PacerHead and pacer_hf.PacerHeadConfig is pacer_core.PacerHeadConfig
    assert pacer_hf.__version__ == pacer_core.__version__ == metadata.version("pacer-core") == metadata.version("pacer-hf")


def _imports(path: Path) -> set[str]:
    """The pacer_hf modules `path` imports, function-local imports included."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            if node.module:
                names.add(node.module.split(".")[0])
            else:  # from . import x
                names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("pacer_hf."):
            names.add(node.module.split(".")[1])
    return names


def test_no_import_cycle_between_modules():
    modules = {p.stem: p for p in PACKAGE.glob("*.py") if p.stem != "__init__"}
    graph = {name: _imports(path) & set(modules) for name, path in modules.items()}
    state: dict[str, str] = {}

    def visit(name: str, stack: list[str]) -> None:
        state[name] = "open"
        for dep in sorted(graph[name]):
            assert state.get(dep) != "open", f"import cycle: {' -> '.join(stack + [name, dep])}"
            if dep not in state:
                visit(dep, stack + [name])
        state[name] = "done"

    for name in sorted(graph):
        if name not in state:
            visit(name, [])
    assert graph["candidate_generator"] >= {"phrases", "stats"}  # the walk reads real imports


def test_pacer_hf_bench_runs_the_harness(tmp_path):
    from pacer_hf.cli import main

    prompts = tmp_path / "prompts.txt"
    prompts.write_text("def add(a, b):\n", encoding="utf-8")
    assert main(["bench", "--pair", "tiny", "--prompts", f"{prompts}:0:1", "--max-new-tokens", "4", "--fixed", "2",
                 "--methods", "fixed-k2", "--out", str(tmp_path / "run")]) == 0
    assert (tmp_path / "run.jsonl").is_file() and (tmp_path / "run.md").is_file()
