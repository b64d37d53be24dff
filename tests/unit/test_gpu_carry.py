"""``benchmarks/gpu_carry.py``: the dependency closure it carries to a GPU machine follows each
wheel's requirements, extras included, down to what the device image has (a requirement reached
through an extra, ``pydantic-extra-types[pycountry]``, was missing from the first carry)."""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest

from tests.benchmark_scripts import load



def _gpu_carry():
    return load("gpu_carry")


def _wheel(folder: Path, name: str, *requires: str) -> Path:
    path = folder / f"{name.replace('-', '_')}-1.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        head = f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n"
        z.writestr(f"{name}-1.0.dist-info/METADATA", head + "".join(f"Requires-Dist: {r}\n" for r in requires))
    return path


def test_requirements_apply_by_extra_and_device_markers(tmp_path):
    wheel = _wheel(tmp_path, "pkg", "plain", 'country; extra == "pycountry"', 'win; sys_platform == "win32"',
                   'old; python_version < "3.12"')
    requires = _gpu_carry().requires
    assert [r.name for r in requires(wheel, set())] == ["plain"]
    assert [r.name for r in requires(wheel, {"pycountry"})] == ["plain", "country"]


@pytest.mark.parametrize("specs", [["app", "other"], ["other", "app"]])  # lib reached plain first, or with [more]
def test_closure_follows_extras_reached_later_and_stops_at_the_device_packages(specs, tmp_path, monkeypatch):
    index = {"app": ["lib", "torch", "have-it"], "lib": ['extra-dep; extra == "more"'], "other": ["lib[more]"],
             "extra-dep": [], "torch": ["never"], "have-it": ["never"]}
    gpu_carry = _gpu_carry()
    fetched = []

    def download(spec: str, dest: Path) -> Path:
        name = spec.split("=")[0].split("<")[0].split(">")[0]
        fetched.append(name)
        return _wheel(dest, name, *index[name])

    monkeypatch.setattr(gpu_carry, "download", download)
    wheels = gpu_carry.closure(specs, {"have-it"}, tmp_path)
    assert sorted(w.name.split("-")[0] for w in wheels) == ["app", "extra_dep", "lib", "other"]
    assert sorted(fetched) == ["app", "extra-dep", "lib", "other"]  # each downloaded once; torch is not carried
