"""Fetch Debian 11's SQLite 3.34.1 (also RHEL 9's version; it has no ``DROP COLUMN``, which
came in 3.35) for the state tests: the library and its headers from Debian's security archive,
each checked by SHA-256, unpacked with ``dpkg-deb`` under ``DEST/root``. The Makefile then
builds pysqlite3 against them (``make old-sqlite``).

    python scripts/old_sqlite.py DEST
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
import urllib.request
from pathlib import Path

POOL = "http://deb.debian.org/debian-security/pool/updates/main/s/sqlite3"
PACKAGES = {
    "libsqlite3-0_3.34.1-3+deb11u1_amd64.deb": "a61ad6c12ec96c443d99b9b05a529025916bfe83bda6ded7f654907d6b501a46",
    "libsqlite3-dev_3.34.1-3+deb11u1_amd64.deb": "c46e519bf0d164bf13890664b151d0006ebb71b33d818420508e1986592e7947",
}


def main(dest: Path) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    for name, sha256 in PACKAGES.items():
        data = urllib.request.urlopen(f"{POOL}/{name}", timeout=120).read()
        if hashlib.sha256(data).hexdigest() != sha256:
            sys.exit(f"{POOL}/{name}: not the package expected (its SHA-256 differs)")
        (dest / name).write_bytes(data)
        subprocess.run(["dpkg-deb", "-x", str(dest / name), str(dest / "root")], check=True)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
