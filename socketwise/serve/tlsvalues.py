"""The front doors' TLS inputs, checked on the controller before anything changes on a host:
a certificate and key pair that can serve, a certificate's pin, and the fleet's CA against
the hosts' own certificates. Never a private key's content in a message."""

from __future__ import annotations

import hashlib
import re
import ssl
import subprocess
from pathlib import Path


def tls_error(cert: str, key: str) -> str | None:
    """Why the PEM files CERT and KEY (on the controller) cannot serve TLS: not a
    certificate, not a private key, an encrypted key (HAProxy cannot ask for its
    passphrase) or a key that is not the certificate's. Never the key's content."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        context.load_cert_chain(cert, key, password=lambda: b"")
    except (ssl.SSLError, OSError) as wrong:
        reason = getattr(wrong, "reason", None) or type(wrong).__name__
        return (
            f"credentials_tls_cert={cert}, credentials_tls_key={key}: the pair cannot serve "
            f"TLS ({reason}); give a PEM certificate and its unencrypted private key"
        )
    return None


def certificate_sha256(path: str) -> str:
    """The SHA-256 of the first certificate in the PEM file PATH (on the controller) in
    upper-case hex, as HAProxy's `ssl_c_der,digest(sha256),hex` gives it; "" when the
    file or a certificate in it is missing (a check-mode run before the first deploy made
    it). A private key beside it is never read."""
    try:
        text = Path(path).read_text()
    except OSError:
        return ""
    found = re.search(r"-----BEGIN CERTIFICATE-----.*?-----END CERTIFICATE-----", text, re.S)
    if not found:
        return ""
    return hashlib.sha256(ssl.PEM_cert_to_DER_cert(found.group(0))).hexdigest().upper()


def fleet_ca_errors(ca: str, servers: list[dict], verify: bool = True) -> list[str]:
    """Why the fleet door could not verify every host's door: CA (credentials_fleet_ca_file,
    a file on the controller, or "") not a certificate, a host serving plain HTTP beside it,
    a host's own certificate (`cert`, its credentials_tls_cert) the CA did not sign or no
    CA given for one. A door the kit's CA issued (`kit`) is verified with that CA. SERVERS:
    the fleet's servers ({name, tls, kit, cert}); VERIFY: fleet_door_verify."""
    own = [server for server in servers if not server.get("kit")]
    if not verify:
        return []
    if not ca:
        return [
            f"{server['name']} serves TLS with its own credentials_tls_cert={server['cert']} "
            "and the fleet door verifies it: give the CA that signed it in "
            "credentials_fleet_ca_file, or set fleet_door_verify: false to take it "
            "unverified"
            for server in own
            if server["tls"]
        ]
    variable = f"credentials_fleet_ca_file={ca}"
    try:
        ssl.create_default_context(cafile=ca)
    except (ssl.SSLError, OSError) as wrong:
        reason = getattr(wrong, "reason", None) or type(wrong).__name__
        fix = "give the CA that signed the hosts' certificates"
        return [f"{variable}: not a PEM CA certificate ({reason}); {fix}"]
    errors = []
    for server in own:
        if not server["tls"]:
            errors.append(
                f"{variable}: {server['name']} serves plain HTTP; give it credentials_tls_cert "
                "signed by that CA, or empty credentials_fleet_ca_file"
            )
            continue
        checked = subprocess.run(
            ["openssl", "verify", "-CAfile", ca, server["cert"]], capture_output=True, text=True
        )
        if checked.returncode != 0:
            said = (checked.stderr + checked.stdout).splitlines()
            # openssl's line with the reason: "error 20 at 0 depth lookup: unable to get ..."
            reason = next((line for line in said if line.startswith("error ")), "not verified")
            errors.append(
                f"{variable}: {server['name']}'s credentials_tls_cert={server['cert']} does not "
                f"verify with it ({reason}); sign it with that CA, or give the CA that did"
            )
    return errors
