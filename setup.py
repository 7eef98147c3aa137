"""The wheel carries the shipped files (`conf/`, the embedded task's cards, models, tokenizer
and data) inside the package, as `specbeam/conf` and `specbeam/tasks`, so an installed
specbeam runs from any directory (`specbeam/paths.py` finds them). The rest of the build
is declared in pyproject.toml."""

from setuptools import find_packages, setup

setup(
    packages=[*find_packages(include=["specbeam*"]), "specbeam.conf", "specbeam.tasks"],
    package_dir={"specbeam.conf": "conf", "specbeam.tasks": "tasks"},
    include_package_data=False,
)
