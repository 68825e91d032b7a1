"""Install pysoftmax's Python dependencies, only those that do not already import.

    python3 tools/deps.py --platform nvidia|amd|none

Checks numpy, cupy, pytest, pytest-benchmark and ml_dtypes (CuPy 14's bfloat16) by importing
them, and pip-installs (``sys.executable -m pip install``) only the missing ones. The CuPy wheel
matches the toolkit: on nvidia ``cupy-cuda<major>x`` from ``nvcc --version``, on amd
``cupy-rocm-7-0``; with ``--platform none`` a missing CuPy is reported and skipped. When every
package imports, nothing is run at all, so it is safe on a machine without network. Prints one
line per package; exits non-zero if an install fails.
"""

import argparse
import importlib
import importlib.metadata
import re
import subprocess
import sys


def _version(module, dist):
    version = getattr(module, "__version__", None)
    if version is None:
        try:
            version = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            version = "unknown version"
    return version


def _import(name):
    """The module, or None if it does not import."""
    try:
        return importlib.import_module(name)
    except Exception:  # ImportError, or a broken install that fails while importing
        return None


def cupy_wheel(platform, required=True):
    """The CuPy distribution for this toolkit, or None when there is no GPU platform (or, with
    required=False, when nvcc cannot tell its release)."""
    if platform == "amd":
        return "cupy-rocm-7-0"
    if platform != "nvidia":
        return None
    try:
        text = subprocess.run(["nvcc", "--version"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        if not required:
            return None
        sys.exit(f"deps: cannot run `nvcc --version` to pick the CuPy wheel ({e}); put nvcc on PATH")
    match = re.search(r"release (\d+)\.", text)
    if not match:
        if not required:
            return None
        sys.exit(f"deps: no CUDA release in `nvcc --version` output:\n{text}")
    return f"cupy-cuda{match.group(1)}x"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--platform", choices=("nvidia", "amd", "none"), required=True)
    platform = parser.parse_args(argv).platform

    # (import name, pip distribution); None = decide only if it is missing (cupy needs nvcc).
    packages = [("numpy", "numpy"), ("cupy", None), ("pytest", "pytest"),
                ("pytest_benchmark", "pytest-benchmark"), ("ml_dtypes", "ml_dtypes")]
    for name, dist in packages:
        module = _import(name)
        if module is not None:
            print(f"{name}: already present ({_version(module, dist or name)})")
            continue
        if dist is None:
            dist = cupy_wheel(platform)
            if dist is None:
                print(f"{name}: missing; skipped (no GPU platform, so no CuPy wheel to pick)")
                continue
        print(f"{name}: missing; installing {dist} ...", flush=True)
        rc = subprocess.call([sys.executable, "-m", "pip", "install", dist])
        importlib.invalidate_caches()
        module = None if rc else _import(name)
        if module is None:
            how = f"pip exited with status {rc}" if rc else "it still does not import after pip install"
            sys.exit(f"deps: could not install {dist} for `import {name}`: {how}")
        print(f"{name}: installed {dist} ({_version(module, dist)})")


if __name__ == "__main__":
    main()
