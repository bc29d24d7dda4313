"""Import every module of the named packages, as installed: ``python import_all.py PACKAGE...``.

Run by the image builds (Containerfile, deploy/image/Containerfile.chaos) after pip installs
the wheels, so an image never ships a module that cannot be imported there (one needing torch,
a dependency missing from the wheel's metadata). Exits 1 naming each module that failed.
"""

from __future__ import annotations

import importlib
import pkgutil
import sys
import traceback


def main(packages: list[str]) -> int:
    names: list[str] = []
    failed: list[str] = []
    for top in packages:
        package = importlib.import_module(top)
        names.append(top)
        # A package that fails is reported once, by the loop: the walk's own retry is ignored.
        walk = pkgutil.walk_packages(package.__path__, f"{top}.", onerror=lambda _: None)
        for info in walk:
            names.append(info.name)
            try:
                importlib.import_module(info.name)
            except Exception:
                failed.append(f"{info.name}: {traceback.format_exc(limit=1).splitlines()[-1]}")
    for line in failed:
        print(f"import_all: {line}", file=sys.stderr)
    print(f"import_all: {len(names) - len(failed)} of {len(names)} modules of {' '.join(packages)}")
    return 1 if failed else 0


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit("usage: import_all.py PACKAGE...")
    sys.exit(main(sys.argv[1:]))
