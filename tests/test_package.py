"""The package's shape: it never imports its benchmark, and its modules import each other without a cycle."""

import ast
import subprocess
import sys
from pathlib import Path

import pacer_hf

PACKAGE = Path(pacer_hf.__file__).parent


def test_importing_the_library_and_building_its_cli_never_imports_the_harness():
    code = ("import sys, pacer_hf; from pacer_hf.cli import build_parser; build_parser(); "
            "print([m for m in sys.modules if m == 'eval' or m.startswith('eval.')])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def _external_imports(path: Path) -> set[str]:
    """The top-level packages other than pacer_hf that `path` imports, function-local imports included."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names - {"pacer_hf"} - set(sys.stdlib_module_names)


def test_the_stop_rule_and_the_head_need_only_torch_safetensors_and_the_hub_client():
    """What a serving engine (vLLM) loads to stop its drafts with a PACER head: never transformers, whose version
    such an engine pins elsewhere, nor anything of the generate() route."""
    closure, todo = set(), ["stop_rule"]
    while todo:
        name = todo.pop()
        if name not in closure:
            closure.add(name)
            todo += sorted(_imports(PACKAGE / f"{name}.py"))
    assert closure == {"stop_rule", "head", "config", "features", "model_card", "_version"}
    needed = set().union(*(_external_imports(PACKAGE / f"{name}.py") for name in closure))
    assert needed == {"torch", "safetensors", "huggingface_hub"}


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
    assert graph["candidate_generator"] >= {"head", "features"}  # the walk reads real imports


def test_pacer_hf_bench_runs_the_harness(tmp_path):
    from pacer_hf.cli import main

    prompts = tmp_path / "prompts.txt"
    prompts.write_text("def add(a, b):\n", encoding="utf-8")
    assert main(["bench", "--pair", "tiny", "--prompts", f"{prompts}:0:1", "--max-new-tokens", "4", "--fixed", "2",
                 "--methods", "fixed-k2", "--out", str(tmp_path / "run")]) == 0
    assert (tmp_path / "run.jsonl").is_file() and (tmp_path / "run.md").is_file()
