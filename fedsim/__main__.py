"""``python -m fedsim``: the ``fedsim`` command, for environments where the
console script is not on PATH."""

from fedsim.cli import main

if __name__ == "__main__":
    main()
