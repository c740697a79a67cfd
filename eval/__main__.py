"""`python -m eval ...` is `pacer-hf bench ...`."""

from .run import main

main()
