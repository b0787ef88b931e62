"""``python -m hintpipe`` and the ``hintpipe`` command: the command line, with Ctrl-C while it imports said in
one line (see [Note: Ctrl-C is one line] in :mod:`hintpipe.cli`)."""

import sys


def run() -> int:
    """Import the command line and run it on ``sys.argv``; its exit status."""
    try:
        from hintpipe.cli import main
    except KeyboardInterrupt:  # before the command line could handle it
        print("hintpipe: stopped by SIGINT; nothing was saved", file=sys.stderr)
        return 130
    return main()


if __name__ == "__main__":
    sys.exit(run())
