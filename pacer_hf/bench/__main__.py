"""`python -m pacer_hf.bench ...` is `pacer-hf bench ...`."""

from .run import main

main()
