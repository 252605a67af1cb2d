#!/usr/bin/env python3
"""Every library the build requires is installed by every recipe that builds thetad.

The top-level CMakeLists.txt's `find_package(NAME ... REQUIRED ...)` calls name what CMake needs;
the table below says which Debian/Ubuntu package brings each. Each recipe — scripts/setup.sh (the
README's commands), the two Dockerfiles and docs/gpu.md's package line — must install every
package of its kind: a recipe that misses one fails at `cmake` on a fresh machine, which no test
on a prepared machine sees. A find_package the table does not know fails too (add its package).

    scripts/check_packages.py --root REPO      exit 0, or 1 listing what is missing
    scripts/check_packages.py --self-test      shows that each check can fail
"""
import os
import re
import sys

import repo_check
import tempfile

# CMake package -> the package that provides it. None: part of the C library or the compiler.
# "torch" is LibTorch: Debian's libtorch-dev on the CPU, a PyTorch wheel (pip) on GPUs.
PROVIDERS = {
    "Threads": None,
    "MPI": "libopenmpi-dev",
    "spdlog": "libspdlog-dev",
    "yaml-cpp": "libyaml-cpp-dev",
    "nlohmann_json": "nlohmann-json3-dev",
    "ZLIB": "zlib1g-dev",
    "Torch": "torch",
    "GTest": "libgtest-dev",
}
# Recipe file -> (how LibTorch comes, whether it builds the tests' GTest).
RECIPES = {
    "scripts/setup.sh": ("libtorch-dev", True),
    "deploy/docker/Dockerfile.cpu": ("libtorch-dev", True),
    "deploy/docker/Dockerfile.gpu": ("pip", True),
    "docs/gpu.md": ("pip", True),
}


def required(cmake_text):
    """The names of the REQUIRED find_package calls."""
    names = []
    for m in re.finditer(r"find_package\(\s*([A-Za-z0-9_\-]+)([^)]*)\)", cmake_text):
        if re.search(r"\bREQUIRED\b", m.group(2)):
            names.append(m.group(1))
    return names


def missing(root):
    problems = []
    cmake = open(os.path.join(root, "CMakeLists.txt")).read()
    names = required(cmake)
    for name in names:
        if name not in PROVIDERS:
            problems.append(f"CMakeLists.txt: find_package({name} REQUIRED) has no package in "
                            f"scripts/check_packages.py's table: add the package that provides it")
    for recipe, (torch_from, with_tests) in RECIPES.items():
        path = os.path.join(root, recipe)
        if not os.path.exists(path):
            problems.append(f"{recipe}: missing")
            continue
        words = set(re.findall(r"[A-Za-z0-9][A-Za-z0-9.+\-]*", open(path).read()))
        for name in names:
            package = PROVIDERS.get(name)
            if package is None or (name == "GTest" and not with_tests):
                continue
            if package == "torch":
                package = "libtorch-dev" if torch_from == "libtorch-dev" else "torch"
                if torch_from == "pip" and not ({"pip", "torch"} <= words or "PyTorch" in words):
                    problems.append(f"{recipe}: does not install PyTorch (LibTorch for find_package(Torch))")
                    continue
                if torch_from == "pip":
                    continue
            if package not in words:
                problems.append(f"{recipe}: does not install {package} (find_package({name}) in CMakeLists.txt)")
    return problems


def self_test():
    """A recipe without one package, and a find_package the table does not know, must fail."""
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with tempfile.TemporaryDirectory() as root:
        for rel in ["CMakeLists.txt"] + list(RECIPES):
            os.makedirs(os.path.dirname(os.path.join(root, rel)) or root, exist_ok=True)
            with open(os.path.join(here, rel)) as src, open(os.path.join(root, rel), "w") as dst:
                dst.write(src.read())
        assert missing(root) == [], missing(root)
        cpu = os.path.join(root, "deploy/docker/Dockerfile.cpu")
        text = open(cpu).read()
        open(cpu, "w").write(text.replace("zlib1g-dev", ""))
        found = missing(root)
        assert any("Dockerfile.cpu: does not install zlib1g-dev" in p for p in found), found
        open(cpu, "w").write(text)
        cmake = os.path.join(root, "CMakeLists.txt")
        with open(cmake, "a") as f:
            f.write("\nfind_package(Boost REQUIRED)\n")
        found = missing(root)
        assert any("find_package(Boost REQUIRED) has no package" in p for p in found), found
    print("check_packages self-test: a missing package and an unknown find_package are both reported")
    return 0


def main():
    return repo_check.run("check_packages", lambda root: (missing(root), f"{len(RECIPES)} recipes install what CMakeLists.txt requires"),
                          self_test)


if __name__ == "__main__":
    sys.exit(main())
