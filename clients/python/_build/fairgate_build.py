"""A PEP 517 build backend in the standard library, for this package only.

Why: ``pip install ./clients/python`` must work offline (no PyPI), and pip's
build isolation would otherwise download setuptools. It builds a pure-Python
wheel from ``src/fairgate`` (and an editable wheel, and an sdist) with the
metadata of ``pyproject.toml``'s ``[project]`` table.
"""

from __future__ import annotations

import base64
import hashlib
import io
import os
import re
import tarfile
import zipfile
from typing import Dict, List, Optional, Tuple

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = "fairgate"


def _project() -> Dict[str, object]:
    with open(os.path.join(HERE, "pyproject.toml"), "rb") as f:
        text = f.read()
    try:
        import tomllib  # Python 3.11+

        return tomllib.loads(text.decode())["project"]
    except ImportError:  # 3.9, 3.10: the few string and list keys of [project]
        out: Dict[str, object] = {}
        section = None
        for line in text.decode().splitlines():
            if line.startswith("["):
                section = line.strip()
            elif section == "[project]":
                m = re.match(r'^(\w[\w-]*)\s*=\s*"(.*)"\s*$', line)
                if m:
                    out[m.group(1)] = m.group(2)
        return out


def _metadata() -> str:
    p = _project()
    lines = [
        "Metadata-Version: 2.1",
        f"Name: {p['name']}",
        f"Version: {p['version']}",
        f"Summary: {p.get('description', '')}",
        f"License: {p.get('license', '')}",
        f"Requires-Python: {p.get('requires-python', '>=3.9')}",
    ]
    for c in p.get("classifiers", []) or []:
        lines.append(f"Classifier: {c}")
    readme = os.path.join(HERE, str(p.get("readme", "README.md")))
    body = ""
    if os.path.exists(readme):
        lines.append("Description-Content-Type: text/markdown")
        with open(readme, encoding="utf-8") as f:
            body = f.read()
    return "\n".join(lines) + "\n\n" + body


def _dist_name() -> Tuple[str, str]:
    p = _project()
    return str(p["name"]), str(p["version"])


def _record_hash(data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"sha256={digest}"


def _write_wheel(directory: str, files: List[Tuple[str, bytes]]) -> str:
    name, version = _dist_name()
    dist_info = f"{name}-{version}.dist-info"
    wheel_name = f"{name}-{version}-py3-none-any.whl"
    files = list(files)
    files.append((f"{dist_info}/METADATA", _metadata().encode()))
    files.append(
        (f"{dist_info}/WHEEL", b"Wheel-Version: 1.0\nGenerator: fairgate_build\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
    )
    record = io.StringIO()
    for path, data in files:
        record.write(f"{path},{_record_hash(data)},{len(data)}\n")
    record.write(f"{dist_info}/RECORD,,\n")
    files.append((f"{dist_info}/RECORD", record.getvalue().encode()))
    with zipfile.ZipFile(os.path.join(directory, wheel_name), "w", zipfile.ZIP_DEFLATED) as z:
        for path, data in files:
            info = zipfile.ZipInfo(path, date_time=(2020, 1, 1, 0, 0, 0))
            info.external_attr = 0o644 << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(info, data)
    return wheel_name


def _package_files() -> List[Tuple[str, bytes]]:
    root = os.path.join(HERE, "src", PACKAGE)
    out = []
    for name in sorted(os.listdir(root)):
        if name.endswith(".py") or name == "py.typed":
            with open(os.path.join(root, name), "rb") as f:
                out.append((f"{PACKAGE}/{name}", f.read()))
    return out


# --- PEP 517 / PEP 660 hooks ---------------------------------------------------
def get_requires_for_build_wheel(config_settings: Optional[dict] = None) -> List[str]:
    return []


def get_requires_for_build_sdist(config_settings: Optional[dict] = None) -> List[str]:
    return []


def get_requires_for_build_editable(config_settings: Optional[dict] = None) -> List[str]:
    return []


def build_wheel(wheel_directory: str, config_settings: Optional[dict] = None, metadata_directory: Optional[str] = None) -> str:
    return _write_wheel(wheel_directory, _package_files())


def build_editable(wheel_directory: str, config_settings: Optional[dict] = None, metadata_directory: Optional[str] = None) -> str:
    src = os.path.join(HERE, "src")
    return _write_wheel(wheel_directory, [(f"_{PACKAGE}_editable.pth", (src + "\n").encode())])


def build_sdist(sdist_directory: str, config_settings: Optional[dict] = None) -> str:
    name, version = _dist_name()
    base = f"{name}-{version}"
    out = f"{base}.tar.gz"
    with tarfile.open(os.path.join(sdist_directory, out), "w:gz") as tar:
        for rel in ["pyproject.toml", "README.md", "_build/fairgate_build.py"] + [
            f"src/{p}" for p, _ in _package_files()
        ]:
            path = os.path.join(HERE, rel)
            if os.path.exists(path):
                tar.add(path, arcname=f"{base}/{rel}")
        data = _metadata().encode()
        info = tarfile.TarInfo(f"{base}/PKG-INFO")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    return out
