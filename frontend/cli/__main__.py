"""`python -m frontend.cli` is the `ringserve` command (tests and tools start the server this way)."""

from frontend.cli import main

main(prog_name="ringserve")
