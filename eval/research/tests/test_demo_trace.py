"""`demo_trace --disturb`: busy loops from the first input the demo builds until the third prompt's."""

from eval.research import demo_trace
from pacer_hf import prompts


def test_disturb_runs_busy_loops_until_the_third_prompt(monkeypatch):
    monkeypatch.setattr(prompts, "chat_input_ids", lambda tokenizer, text: text)
    loops = []
    demo_trace._disturb(loops)
    assert prompts.chat_input_ids(None, "Hi") == "Hi" and loops  # the warm-up's input: the loops start
    for text in ("prompt 1", "prompt 2"):
        prompts.chat_input_ids(None, text)
        assert loops and all(loop.poll() is None for loop in loops), text
    started = list(loops)
    prompts.chat_input_ids(None, "prompt 3")  # alone
    assert not loops and all(loop.poll() is not None for loop in started)
