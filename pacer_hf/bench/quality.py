"""Quality of decoded text: HumanEval pass@1 through the local `evaluate` metric in `eval/metrics/`."""

import re
from pathlib import Path

_METRIC_PATH = Path(__file__).parent / "metrics" / "humaneval_pass_at_1"
_CODE_BLOCK = re.compile(r"```(?:python|py)?\s*\n(.*?)(?:```|$)", re.DOTALL)


def humaneval_program(completion: str, meta: dict) -> str:
    """The program a completion stands for: its first code block (or the whole text), prefixed with the problem's
    prompt when the completion does not define the function itself."""
    match = _CODE_BLOCK.search(completion)
    code = match.group(1) if match else completion
    if f"def {meta['entry_point']}" not in code:
        code = meta["prompt"] + code
    return code


def humaneval_pass_at_1(completions: list[str], metas: list[dict]) -> dict:
    """Runs the local `evaluate` metric (nothing is fetched from a hub). Returns `{"pass@1", "passed"}`."""
    import evaluate

    metric = evaluate.load(str(_METRIC_PATH))
    return metric.compute(
        predictions=[humaneval_program(c, m) for c, m in zip(completions, metas)],
        references=[f"{m['test']}\ncheck({m['entry_point']})" for m in metas],
    )
