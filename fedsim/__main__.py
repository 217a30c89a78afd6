"""``python -m fedsim`` and the ``fedsim`` console script.

fedsim/interrupts.py's handlers are installed before anything else is
imported: typer, rich and the command's modules take a noticeable time to
import, and a Ctrl-C or SIGTERM in that time must end as one anywhere else
does (exit 130, one line), not as a traceback or a silent kill.
"""

import os

from fedsim import interrupts


def main() -> None:
    """Run the ``fedsim`` command (fedsim.tools.cli.main) under fedsim's
    signal handlers, installed before the command line is imported.

    Raises:
        SystemExit: the command's exit code; 130, after one line, for an
            interrupt that arrived before the command could say it.
    """
    with interrupts.stop_at_round_ends():
        try:
            from fedsim.tools.cli import main as cli_main

            cli_main()
        except KeyboardInterrupt:
            os.write(2, b"interrupted: stopped before the command began\n")
            raise SystemExit(130) from None


if __name__ == "__main__":
    main()
