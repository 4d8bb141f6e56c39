"""The kit's own CA for the front doors' TLS, kept on the controller.

A door with `credentials_tls: true` and no certificate of the operator's gets one issued
here: the CA is made once in the credentials directory (door-ca.pem, public, what clients
and the fleet door verify the doors with; door-ca.key, 0600, kept so that a later deploy
can renew), and each door's certificate and key go to doors/HOST.pem (0600). A
certificate lasts DAYS; a deploy in its last RENEW_DAYS, or one that finds it names other
names or another CA signed it (the CA was replaced), issues it anew.

    python -m socketwise.serve.doorcerts DIR [--check] [HOST NAME...]

prints {"ca", "pem", "done", "not_after"} as JSON: done is "made" (only the CA, no HOST
given), "issued", "renewed" or "kept". --check says what a run would do, writing nothing.
"""

from __future__ import annotations

import argparse
import fcntl
import ipaddress
import json
import os
import re
import secrets
import subprocess
import sys
import tempfile
from pathlib import Path

DAYS = 365
RENEW_DAYS = 30
CA_DAYS = 3650
CA_NAME = "socketwise door CA"
HOST = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
DNS = re.compile(r"(?=.{1,253}$)([A-Za-z0-9_]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?\.?)+")


class Refused(ValueError):
    """A host or name a certificate cannot carry."""


def san(names: list[str]) -> list[str]:
    """NAMES as the subjectAltName entries of a certificate ("IP:..." for an address,
    "DNS:..." for the rest), each once, in order."""
    entries = []
    for name in dict.fromkeys(names):
        try:
            entries.append(f"IP:{ipaddress.ip_address(name)}")
        except ValueError:
            if not DNS.fullmatch(name):
                raise Refused(
                    f"{name!r} is neither an IP address nor a DNS name; fix it in "
                    "credentials_tls_names, ansible_host or door_listen_address"
                ) from None
            entries.append(f"DNS:{name.rstrip('.')}")
    return list(dict.fromkeys(entries))


def names_error(host: str, names: list[str]) -> str:
    """Why HOST's door certificate cannot be issued for NAMES (one line), or ""."""
    if not HOST.fullmatch(host):
        return f"{host!r} cannot name a certificate file; rename the inventory host"
    try:
        san([host, *names])
    except Refused as refused:
        return str(refused)
    return ""


def openssl(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["openssl", *args], capture_output=True, text=True, check=check)


def _write(path: Path, data: str, mode: int) -> None:
    """PATH holds DATA with MODE from its first byte: written beside it, then renamed."""
    part = path.with_name(f".{path.name}.part")
    descriptor = os.open(part, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(descriptor, "w") as out:
        out.write(data)
    os.chmod(part, mode)
    os.replace(part, path)


def _new_key(path: Path) -> None:
    openssl("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", str(path))


def ca(directory: Path, work: Path) -> bool:
    """DIRECTORY's door CA (door-ca.pem, door-ca.key), made when missing: whether made."""
    cert, key = directory / "door-ca.pem", directory / "door-ca.key"
    if cert.exists() and key.exists():
        return False
    _new_key(work / "ca.key")
    openssl(
        "req", "-x509", "-new", "-key", str(work / "ca.key"), "-days", str(CA_DAYS),
        "-subj", f"/CN={CA_NAME}",
        "-addext", "basicConstraints=critical,CA:TRUE,pathlen:0",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign",
        "-out", str(work / "ca.pem"),
    )  # fmt: skip
    _write(key, (work / "ca.key").read_text(), 0o600)
    _write(cert, (work / "ca.pem").read_text(), 0o644)
    return True


def held_names(pem: Path) -> list[str]:
    """The subjectAltName entries of PEM's certificate, as san() spells them."""
    said = openssl("x509", "-in", str(pem), "-noout", "-ext", "subjectAltName", check=False)
    entries = []
    for entry in ",".join(said.stdout.splitlines()[1:]).split(","):
        kind, _, value = entry.strip().partition(":")
        if kind == "IP Address":
            entries.append(f"IP:{ipaddress.ip_address(value)}")
        elif kind == "DNS":
            entries.append(f"DNS:{value}")
    return entries


def why_reissue(pem: Path, authority: Path, names: list[str]) -> str | None:
    """Why the door certificate in PEM must be issued anew ("issued" when there is none,
    else "renewed"), or None when AUTHORITY signed it, for NAMES, before its renewal
    window."""
    if not pem.exists():
        return "issued"
    if openssl("verify", "-CAfile", str(authority), str(pem), check=False).returncode != 0:
        return "renewed"
    if held_names(pem) != names:
        return "renewed"
    lasting = openssl(
        "x509", "-in", str(pem), "-noout", "-checkend", str(RENEW_DAYS * 86400), check=False
    )
    return "renewed" if lasting.returncode != 0 else None


def issue(directory: Path, host: str, names: list[str], work: Path) -> str:
    """A server certificate for HOST's door under NAMES, with its key: one PEM."""
    _new_key(work / "door.key")
    openssl("req", "-new", "-key", str(work / "door.key"), "-subj", f"/CN={host}",
            "-out", str(work / "door.csr"))  # fmt: skip
    (work / "ext").write_text(
        "basicConstraints=critical,CA:FALSE\n"
        "keyUsage=critical,digitalSignature\n"
        "extendedKeyUsage=serverAuth\n"
        f"subjectAltName={','.join(names)}\n"
    )
    openssl(
        "x509", "-req", "-in", str(work / "door.csr"),
        "-CA", str(directory / "door-ca.pem"), "-CAkey", str(directory / "door-ca.key"),
        "-set_serial", f"0x{secrets.token_hex(16)}", "-days", str(DAYS),
        "-extfile", str(work / "ext"), "-out", str(work / "door.crt"),
    )  # fmt: skip
    return (work / "door.crt").read_text() + (work / "door.key").read_text()


def door(directory: Path, host: str | None, names: list[str], check: bool = False) -> dict:
    """Make DIRECTORY's door CA when missing and, for HOST, its certificate under NAMES
    when missing, due or stale (see the module's text); what was done."""
    refused = names_error(host, names) if host is not None else ""
    if refused:
        raise Refused(refused)
    wanted = san([host, *names]) if host is not None else []
    authority = directory / "door-ca.pem"
    pem = directory / "doors" / f"{host}.pem" if host is not None else None
    result = {"ca": str(authority), "pem": str(pem or "")}
    if check:
        if not authority.exists():
            return result | {"done": "issued" if pem else "made"}
        return result | {"done": (why_reissue(pem, authority, wanted) if pem else None) or "kept"}
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="socketwise-door-") as temporary:
        work = Path(temporary)
        # Every host of a play runs this at once: one makes the CA, the rest wait for it.
        with open(directory / ".door-ca.lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            made = ca(directory, work)
        if pem is None:
            return result | {"done": "made" if made else "kept"}
        pem.parent.mkdir(mode=0o700, exist_ok=True)
        done = why_reissue(pem, authority, wanted)
        if done:
            _write(pem, issue(directory, host, wanted, work), 0o600)
    ends = openssl("x509", "-in", str(pem), "-noout", "-enddate").stdout.strip()
    return result | {"done": done or "kept", "not_after": ends.partition("=")[2]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m socketwise.serve.doorcerts")
    parser.add_argument("directory", type=Path)
    parser.add_argument("--check", action="store_true")
    parser.add_argument("host", nargs="?")
    parser.add_argument("names", nargs="*")
    args = parser.parse_intermixed_args(argv)
    try:
        done = door(args.directory, args.host, args.names, args.check)
    except Refused as refused:
        print(f"{args.host}: {refused}", file=sys.stderr)
        return 2
    print(json.dumps(done))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
