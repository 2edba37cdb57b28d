"""TLS, mutual TLS and the bearer token from Python against real shards that
require all three (certificates made with openssl, as tests/server/
tls_test.cc makes them)."""

import shutil
import subprocess
import threading

import pytest
import torch

import pserver
import pserver.torch

TOKEN = "python-test-token-0123456789"


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    """ca, other_ca; server (127.0.0.1) and client signed by ca; intruder
    signed by other_ca; token and wrong_token files. EC P-256, 2 days."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl not installed: no certificates for the TLS test")
    d = tmp_path_factory.mktemp("pki")

    def sh(*args):
        subprocess.run(args, cwd=d, check=True, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, timeout=60)

    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
          "-nodes"]
    for ca in ("ca", "other_ca"):
        sh("openssl", "req", "-x509", *ec, "-days", "2", "-subj", f"/CN={ca}",
           "-keyout", f"{ca}.key", "-out", f"{ca}.pem")
    for name, ca, ext in [
            ("server", "ca", "subjectAltName=IP:127.0.0.1,DNS:localhost\n"
                             "extendedKeyUsage=serverAuth\n"),
            ("client", "ca", "extendedKeyUsage=clientAuth\n"),
            ("intruder", "other_ca", "extendedKeyUsage=clientAuth\n")]:
        (d / f"{name}.ext").write_text(ext)
        sh("openssl", "req", "-new", *ec, "-subj", f"/CN={name}", "-keyout",
           f"{name}.key", "-out", f"{name}.csr")
        sh("openssl", "x509", "-req", "-in", f"{name}.csr", "-CA",
           f"{ca}.pem", "-CAkey", f"{ca}.key", "-CAcreateserial", "-days", "2",
           "-extfile", f"{name}.ext", "-out", f"{name}.pem")
    (d / "token").write_text(TOKEN + "\n")
    (d / "wrong_token").write_text("not-" + TOKEN + "\n")
    return d


def secure_shards(shards, pki, num_shards, num_workers, *flags):
    return shards(num_shards, num_workers, f"--tls_cert={pki / 'server.pem'}",
                  f"--tls_key={pki / 'server.key'}",
                  f"--tls_ca={pki / 'ca.pem'}",
                  f"--auth_token_file={pki / 'token'}", *flags)


def client_tls(pki, client="client", ca="ca", token="token"):
    return {"tls_ca": str(pki / f"{ca}.pem"),
            "tls_cert": str(pki / f"{client}.pem"),
            "tls_key": str(pki / f"{client}.key"),
            "auth_token_file": str(pki / token)}


def test_two_workers_train_over_mutual_tls_with_a_token(shards, pki,
                                                        monkeypatch):
    monkeypatch.delenv("PSERVER_AUTH_TOKEN", raising=False)
    addrs = secure_shards(shards, pki, 2, 2, "--optimizer=adam", "--lr=0.01")
    models = []
    for seed in (1, 2):
        torch.manual_seed(seed)
        models.append(torch.nn.Linear(5, 3))
    opts = [None, None]
    errors = []

    def run(r):
        try:
            opts[r] = pserver.torch.DistributedOptimizer(
                models[r].named_parameters(), servers=addrs, worker_id=r,
                num_workers=2, push_codec="fp32", retry_budget=20,
                **client_tls(pki))
            for step in range(3):
                g = torch.Generator().manual_seed(10 * step + r)
                models[r](torch.randn(4, 5, generator=g)).sum().backward()
                opts[r].step()
                opts[r].zero_grad()
        except BaseException as e:  # noqa: BLE001 (re-raised below)
            errors.append(e)

    threads = [threading.Thread(target=run, args=(r,)) for r in (1, 0)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
        assert not t.is_alive()
    if errors:
        raise errors[0]
    assert opts[0].client.security == "mutual TLS+token"
    assert opts[0].global_step == opts[1].global_step == 3
    assert opts[0].stats()["push_payload_bytes"] > 0
    for a, b in zip(models[0].parameters(), models[1].parameters()):
        assert torch.equal(a, b)


def test_wrong_credentials_are_refused(shards, pki, monkeypatch):
    monkeypatch.delenv("PSERVER_AUTH_TOKEN", raising=False)
    addrs = secure_shards(shards, pki, 1, 1, "--optimizer=sgd")
    w = torch.zeros(4)

    def register(**tls):
        c = pserver.Client(addrs, 0, 1, retry_budget=1, rpc_timeout=1, **tls)
        c.register(["w"], [[4]], w)
        return c

    with pytest.raises(pserver.Error) as e:
        register(**client_tls(pki, token="wrong_token"))
    assert e.value.code == "UNAUTHENTICATED"
    # Refused in the handshake, which a retry cannot fix: the retry budget
    # runs out.
    for tls in ({},  # plaintext
                client_tls(pki, client="intruder"),  # client CA unknown
                client_tls(pki, ca="other_ca")):  # server not trusted
        with pytest.raises(pserver.Error) as e:
            register(**tls)
        assert e.value.code in ("UNAVAILABLE", "DEADLINE_EXCEEDED"), tls
    assert register(**client_tls(pki)).registered


def test_tls_arguments_are_checked_before_connecting(pki, monkeypatch):
    monkeypatch.delenv("PSERVER_AUTH_TOKEN", raising=False)
    addrs = ["127.0.0.1:1"]
    good = client_tls(pki)
    with pytest.raises(ValueError, match="^tls_key: "):
        pserver.Client(addrs, 0, 1, **dict(good, tls_key=""))
    with pytest.raises(ValueError, match="^auth_token_file: "):
        pserver.Client(addrs, 0, 1, auth_token_file=str(pki / "token"))
    with pytest.raises(pserver.Error, match="^tls_ca: ") as e:
        pserver.Client(addrs, 0, 1, **dict(good, tls_ca=str(pki / "none")))
    assert e.value.code == "NOT_FOUND"
    assert pserver.Client(addrs, 0, 1).security == "plaintext"
    assert pserver.Client(addrs, 0, 1, tls_ca=good["tls_ca"]).security == "TLS"
    monkeypatch.setenv("PSERVER_AUTH_TOKEN", TOKEN)
    assert pserver.Client(addrs, 0, 1, **dict(good, auth_token_file="")) \
        .security == "mutual TLS+token"
