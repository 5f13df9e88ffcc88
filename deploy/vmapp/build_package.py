"""Build the se-bridge VM Application package: one ``.tar.gz`` for an Azure Compute Gallery
application version (upload it to the artifacts container; infra/modules/vm-application.bicep
``packageUrl``).

Why a self-contained package: VM Applications exist so that locked-down VMs (no internet, no package
index) get software from the gallery's own replicas. So the package carries the project's wheel and
a wheel of every dependency for the VMs' platform, and installs with ``pip --no-index``. The Python
versions are those the installer may pick on the VM (the newest ``python3`` >= 3.11: 3.11 and 3.12 on
the supported distributions), each with its own binary wheels where a dependency has them.

Layout (what deploy/vmapp/manage.sh expects)::

    se-bridge/install.sh   deploy/linux/install.sh
    se-bridge/manage.sh    install | update | remove
    se-bridge/EXTRAS       the extras bundled (manage.sh installs exactly these)
    se-bridge/wheels/      scheduled_events_bridge-*.whl and its dependencies

    python deploy/vmapp/build_package.py dist/se-bridge.tar.gz                 # linux x86_64, 3.11 + 3.12
    python deploy/vmapp/build_package.py out.tar.gz --arch aarch64 --extras eventhubs
    python deploy/vmapp/build_package.py out.tar.gz --extras '' --here         # this machine (the tests)
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
TOP = "se-bridge"  # the directory the install command unpacks and runs
DEFAULT_EXTRAS = "eventhubs,keyvault"
PYTHONS = ("3.11", "3.12")
# manylinux_2_17 (glibc 2.17) is what every dependency's Linux wheels are built for; the VMs' distributions
# all have a newer glibc. Listed both ways: pip matches the tags a wheel's name carries.
PLATFORMS = ("manylinux2014_{arch}", "manylinux_2_17_{arch}", "manylinux_2_28_{arch}")


def build(out: Path, *, extras: str, arch: str, pythons: tuple[str, ...], here: bool) -> list[str]:
    quiet = ["--quiet", "--disable-pip-version-check"]
    with tempfile.TemporaryDirectory() as work:
        wheels = Path(work) / "wheels"
        pip = [sys.executable, "-m", "pip"]
        subprocess.run([*pip, "wheel", *quiet, "--no-deps", "-w", str(wheels), str(ROOT)], check=True)
        (wheel,) = wheels.glob("scheduled_events_bridge-*.whl")
        requirement = f"{wheel}[{extras}]" if extras else str(wheel)
        if here:  # the interpreter and platform of this machine (the tests install what they build)
            subprocess.run([*pip, "download", *quiet, "-d", str(wheels), requirement], check=True)
        for python in () if here else pythons:
            platforms = [arg for p in PLATFORMS for arg in ("--platform", p.format(arch=arch))]
            subprocess.run(
                [*pip, "download", *quiet, "-d", str(wheels), "--only-binary=:all:", "--implementation",
                 "cp", "--python-version", python, *platforms, requirement],
                check=True,
            )  # fmt: skip
        out.parent.mkdir(parents=True, exist_ok=True)
        with tarfile.open(out, "w:gz") as package:
            _add(package, HERE / "manage.sh", "manage.sh", 0o755)
            _add(package, ROOT / "deploy" / "linux" / "install.sh", "install.sh", 0o755)
            extras_file = Path(work) / "EXTRAS"
            extras_file.write_text(extras + "\n")
            _add(package, extras_file, "EXTRAS", 0o644)
            for path in sorted(wheels.glob("*.whl")):
                _add(package, path, f"wheels/{path.name}", 0o644)
        with tarfile.open(out) as package:
            return package.getnames()


def _add(package: tarfile.TarFile, path: Path, name: str, mode: int) -> None:
    info = package.gettarinfo(str(path), f"{TOP}/{name}")
    info.mode, info.uid, info.gid, info.uname, info.gname = mode, 0, 0, "root", "root"
    with path.open("rb") as data:
        package.addfile(info, data)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument(
        "--extras", default=DEFAULT_EXTRAS, help=f"extras to bundle (default {DEFAULT_EXTRAS})"
    )
    parser.add_argument("--arch", default="x86_64", choices=("x86_64", "aarch64"))
    parser.add_argument("--python", action="append", dest="pythons", help="Python version (repeatable)")
    parser.add_argument("--here", action="store_true", help="wheels for this machine's Python and platform")
    args = parser.parse_args()
    names = build(
        args.out, extras=args.extras, arch=args.arch, pythons=tuple(args.pythons or PYTHONS), here=args.here
    )
    wheels = [n for n in names if n.endswith(".whl")]
    print(f"{args.out}: {len(wheels)} wheels, {args.out.stat().st_size / 1e6:.1f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
