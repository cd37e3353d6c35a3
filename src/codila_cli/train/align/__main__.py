"""``python -m codila_cli.train.align ARGS`` (what torchrun starts in every process): the flags of
``codila train align``, parsed by that same command."""

import sys

from codila_cli.cli.app import main

if __name__ == "__main__":
    sys.argv = ["codila", "train", "align", *sys.argv[1:]]
    main()
