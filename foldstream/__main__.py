"""``python -m foldstream``: the command line (:mod:`foldstream.cli`)."""

from foldstream.cli import main

if __name__ == "__main__":  # tools that import every module (docs) must not run the CLI
    main()
