"""Build the signer Function's package: a zip for ``WEBSITE_RUN_FROM_PACKAGE`` (upload it to the
artifacts container; infra/main.bicep ``signerPackageUrl``).

A package run from a URL gets no remote build, so its dependencies are in it, for the Functions
host's platform (Linux x86_64, Python 3.11), under ``.python_packages/lib/site-packages``::

    python infra/signer/build_package.py dist/signer.zip            # the project from this tree + PyPI
    python infra/signer/build_package.py dist/signer.zip --no-deps  # layout only (the tests)
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
FILES = ("function_app.py", "signer.py", "host.json", "requirements.txt")
SITE = ".python_packages/lib/site-packages"


def build(out: Path, deps: bool) -> list[str]:
    with tempfile.TemporaryDirectory() as work:
        target, wheels = Path(work) / SITE, Path(work) / "wheels"
        quiet = ["--quiet", "--disable-pip-version-check"]
        subprocess.run(
            [sys.executable, "-m", "pip", "wheel", *quiet, "--no-deps", "-w", str(wheels), str(ROOT)],
            check=True,
        )
        wheel = str(next(wheels.glob("*.whl")))
        pip = [sys.executable, "-m", "pip", "install", *quiet, "--target", str(target)]
        if deps:  # binary wheels for the Functions host's platform, whatever this machine is
            pip += ["--platform", "manylinux2014_x86_64", "--python-version", "3.11", "--only-binary=:all:"]
            subprocess.run([*pip, "azure-functions>=1.18", wheel], check=True)
        else:
            subprocess.run([*pip, "--no-deps", wheel], check=True)
        out.parent.mkdir(parents=True, exist_ok=True)
        with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as package:
            for name in FILES:
                package.write(HERE / name, name)
            for path in sorted(target.rglob("*")):
                if path.is_file() and "__pycache__" not in path.parts:
                    package.write(path, f"{SITE}/{path.relative_to(target).as_posix()}")
        return zipfile.ZipFile(out).namelist()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--no-deps", action="store_true", help="only this project, not its dependencies")
    args = parser.parse_args()
    names = build(args.out, deps=not args.no_deps)
    print(f"{args.out}: {len(names)} files")
    return 0


if __name__ == "__main__":
    sys.exit(main())
