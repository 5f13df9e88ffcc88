"""``python -m bridge.imds.emulator``: run the emulator in the foreground (as ``se-bridge simulate``)."""

import argparse
import sys

from .cli import add_arguments, run


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bridge.imds.emulator",
        description="Azure IMDS Scheduled Events emulator (see docs/emulator.md).",
    )
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
