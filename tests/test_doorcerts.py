"""The kit's door CA (socketwise.serve.doorcerts): a door's certificate is issued once,
kept while good, issued anew when due, for other names or from a replaced CA, verifies
for its names only, and no key is readable but by root."""

import datetime
import json
import socket
import ssl
import subprocess
import sys
import threading

import pytest
from cryptography import x509

from socketwise.serve import doorcerts


def issue(directory, host="edge-01", *names):
    return doorcerts.door(directory, host, list(names))


def served(pem, ca, name, address="127.0.0.1"):
    """A TLS server with PEM's certificate and key, and a client that verifies it against CA
    as NAME: None when it verified, else the reason."""
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(pem)
    listener = socket.create_server((address, 0))
    port = listener.getsockname()[1]

    def accept():
        connection, _ = listener.accept()
        try:
            server.wrap_socket(connection, server_side=True).close()
        except (ssl.SSLError, OSError):
            connection.close()

    thread = threading.Thread(target=accept)
    thread.start()
    client = ssl.create_default_context(cafile=ca)
    try:
        with socket.create_connection((address, port)) as raw:
            client.wrap_socket(raw, server_hostname=name).close()
        return None
    except ssl.SSLCertVerificationError as wrong:
        return wrong.verify_message
    finally:
        thread.join()
        listener.close()


def test_a_door_certificate_verifies_under_its_names_and_no_other(tmp_path):
    done = issue(tmp_path, "edge-01", "127.0.0.1", "edge-01.example")
    assert done["done"] == "issued"
    for name in ("edge-01", "edge-01.example", "127.0.0.1"):
        assert served(done["pem"], done["ca"], name) is None, name
    assert "mismatch" in served(done["pem"], done["ca"], "edge-02")
    # The key of the CA and the door's are root's alone; the CA's certificate is public.
    assert (tmp_path / "door-ca.key").stat().st_mode & 0o777 == 0o600
    assert (tmp_path / "doors" / "edge-01.pem").stat().st_mode & 0o777 == 0o600
    assert (tmp_path / "door-ca.pem").stat().st_mode & 0o777 == 0o644
    assert (tmp_path / "doors").stat().st_mode & 0o777 == 0o700


def test_a_good_certificate_is_kept_and_a_due_one_renewed(tmp_path, monkeypatch):
    first = issue(tmp_path, "edge-01", "10.0.0.1")
    pem = (tmp_path / "doors" / "edge-01.pem").read_bytes()
    assert issue(tmp_path, "edge-01", "10.0.0.1")["done"] == "kept"
    assert (tmp_path / "doors" / "edge-01.pem").read_bytes() == pem
    # Within the renewal window: a deploy issues it anew, from the same CA.
    monkeypatch.setattr(doorcerts, "RENEW_DAYS", doorcerts.DAYS + 1)
    renewed = issue(tmp_path, "edge-01", "10.0.0.1")
    assert renewed["done"] == "renewed" and renewed["ca"] == first["ca"]
    assert (tmp_path / "doors" / "edge-01.pem").read_bytes() != pem
    cert = x509.load_pem_x509_certificate((tmp_path / "doors" / "edge-01.pem").read_bytes())
    left = cert.not_valid_after_utc - datetime.datetime.now(datetime.UTC)
    assert (
        datetime.timedelta(days=doorcerts.DAYS - 1)
        < left
        <= datetime.timedelta(days=doorcerts.DAYS)
    )


def test_new_names_issue_it_anew(tmp_path):
    issue(tmp_path, "edge-01", "10.0.0.1")
    done = issue(tmp_path, "edge-01", "127.0.0.1")
    assert done["done"] == "renewed"
    assert served(done["pem"], done["ca"], "127.0.0.1") is None


def test_a_replaced_ca_reissues_the_door_and_the_ca_alone_is_made_once(tmp_path):
    issue(tmp_path, "edge-01", "127.0.0.1")
    for made in ("door-ca.pem", "door-ca.key"):
        (tmp_path / made).unlink()
    done = issue(tmp_path, "edge-01", "127.0.0.1")
    assert done["done"] == "renewed"
    assert served(done["pem"], done["ca"], "127.0.0.1") is None
    assert doorcerts.door(tmp_path / "other", None, [])["done"] == "made"
    assert doorcerts.door(tmp_path / "other", None, [])["done"] == "kept"


def test_check_mode_writes_nothing(tmp_path):
    said = subprocess.run(
        [sys.executable, "-m", "socketwise.serve.doorcerts", str(tmp_path / "c"), "--check",
         "edge-01", "127.0.0.1"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert json.loads(said.stdout)["done"] == "issued"
    assert not (tmp_path / "c").exists()


@pytest.mark.parametrize(
    "host, names, said",
    [
        ("edge 01", [], "'edge 01' cannot name a certificate file; rename the inventory host"),
        ("../x", [], "'../x' cannot name a certificate file"),
        ("edge-01", ["bad name"], "'bad name' is neither an IP address nor a DNS name; fix it in"),
        ("edge-01", ["a..b"], "'a..b' is neither an IP address nor a DNS name"),
    ],
)  # fmt: skip
def test_a_name_no_certificate_can_carry_is_refused_in_one_line_before_anything_is_written(
    tmp_path, host, names, said
):
    assert doorcerts.names_error(host, names).startswith(said)
    done = subprocess.run(
        [sys.executable, "-m", "socketwise.serve.doorcerts", str(tmp_path / "c"), host, *names],
        capture_output=True, text=True,
    )  # fmt: skip
    assert done.returncode == 2 and said in done.stderr and len(done.stderr.splitlines()) == 1
    assert not (tmp_path / "c").exists()


def test_the_ca_signs_doors_alone_and_a_door_certificate_serves_no_client(tmp_path):
    """The kit's door CA may sign no CA of its own (path length 0), and what it issues a
    door is for a server alone: a door's certificate shown as a client's (as the fleet
    door shows its own) is no client certificate. The directory it makes is root's alone."""
    directory = tmp_path / "credentials"
    assert issue(directory, "edge-01")["done"] == "issued"
    authority = x509.load_pem_x509_certificate((directory / "door-ca.pem").read_bytes())
    constraints = authority.extensions.get_extension_for_class(x509.BasicConstraints)
    assert constraints.critical and constraints.value.ca and constraints.value.path_length == 0
    pem = x509.load_pem_x509_certificate((directory / "doors/edge-01.pem").read_bytes())
    usage = pem.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(usage) == [x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]
    assert directory.stat().st_mode & 0o777 == 0o700
