"""Docker "machines" on this one: containers each running its own dockerd and sshd (images/lab-machine,
on a debootstrap base with Debian's docker.io), on a network of their own, reached over SSH as
root with a key made for the test; and the machines.yaml that names them. Each engine also
answers on tcp://ADDRESS:2376 with TLS, to a client certificate of the test's own CA
(``Machines.tls``), as an engine a site opens to the network would.

The flags are those ../shared/ENVIRONMENT.md found to work here (--privileged does not): every
capability but SYS_RESOURCE, no seccomp or AppArmor, the host's cgroup tree writable (cgroup v1),
and /var/lib/docker on a volume so the inner engine can use overlay2. ``remove`` takes it all away,
the inner engines' cgroup directories (/dind-NAME) too.
"""
from __future__ import annotations

import datetime
import io
import ipaddress
import subprocess
import tarfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import docker
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from docker.errors import NotFound

from lab.containerlab import image, networks
from lab.net.subnets import free_subnets

REPO = Path(__file__).resolve().parents[1]
MACHINE_DIR = REPO / "images" / "lab-machine"
PACKAGES = ("docker.io", "openssh-server", "iptables", "iproute2", "procps", "ca-certificates",
            "wireguard-go", "wireguard-tools", "sudo", "iputils-ping")  # (the last four: `lab net overlay --hosts`)
TEST_LABEL = "lab.test-machines"  # on what this module makes
CGROUP_ROOT = Path("/sys/fs/cgroup")
ENGINE_WAIT = 90.0
SUBNET = "10.216.0.0/24"  # the machines' network, when free (else the next free /24): they have fixed addresses
TLS_PORT = 2376


@dataclass(frozen=True)
class Machines:
    file: Path  # machines.yaml
    names: tuple[str, ...]  # m1, m2...
    addresses: dict[str, str]
    prefix: str
    tls: Path  # a client's ca.pem, cert.pem and key.pem for the engines' tcp://ADDRESS:2376

    def container(self, name: str) -> str:
        return f"{self.prefix}-{name}"

    def docker(self, name: str, *argv: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """``docker ARGV`` run on machine ``name``'s own engine."""
        return subprocess.run(["docker", "exec", self.container(name), "docker", *argv], capture_output=True,
                              text=True, timeout=timeout)


def build(client: docker.DockerClient, state_dir: Path) -> str:
    """The machine image's tag, built when its inputs changed (debootstrap once: about two minutes)."""
    say = print
    base = image.offline_base(client, state_dir, say, lambda line: None, PACKAGES, "lab-machine-base")
    files = {p.name: p for p in sorted(MACHINE_DIR.iterdir()) if p.is_file()}
    return image.ensure_built(client, "lab-machine", base, files, say, lambda line: None)


def start(client: docker.DockerClient, tag: str, prefix: str, count: int, workdir: Path) -> Machines:
    """``count`` machines and the machines.yaml (in ``workdir``, with their key and known_hosts)."""
    key = workdir / "machine_key"
    private = Ed25519PrivateKey.generate()
    key.write_bytes(private.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
                                          serialization.NoEncryption()))
    key.chmod(0o600)
    public = private.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    subnet = free_subnets([SUBNET], networks.engine_subnets(client) + networks.host_routes())[0]
    ipam = docker.types.IPAMConfig(pool_configs=[docker.types.IPAMPool(subnet=subnet)])
    network = client.networks.create(f"{prefix}-net", driver="bridge", ipam=ipam, labels={TEST_LABEL: prefix})
    names = tuple(f"m{i}" for i in range(1, count + 1))
    addresses = {name: str(ipaddress.ip_network(subnet)[10 + i]) for i, name in enumerate(names, 1)}
    engine_tls = certificates(workdir / "tls", addresses)
    for name in names:
        volume = client.volumes.create(f"{prefix}-{name}-docker", labels={TEST_LABEL: prefix})
        host_config = client.api.create_host_config(
            cap_add=["ALL"], cap_drop=["SYS_RESOURCE"], security_opt=["seccomp=unconfined", "apparmor=unconfined"],
            devices=["/dev/net/tun:/dev/net/tun:rwm"],  # (as a VM has it)
            binds={"/sys/fs/cgroup": {"bind": "/sys/fs/cgroup", "mode": "rw"},
                   volume.name: {"bind": "/var/lib/docker", "mode": "rw"}})
        host_config.update(MaskedPaths=[], ReadonlyPaths=[])  # (the CLI's --security-opt systempaths=unconfined)
        created = client.api.create_container(
            tag, name=f"{prefix}-{name}", hostname=name, detach=True, labels={TEST_LABEL: prefix},
            host_config=host_config,
            networking_config=client.api.create_networking_config({network.name: client.api.create_endpoint_config(
                ipv4_address=addresses[name])}))
        client.api.put_archive(created["Id"], "/etc/lab-machine", _tar({"authorized_keys": public + b"\n",
                                                                        **engine_tls[name]}))
        client.api.start(created["Id"])
    containers = {name: client.containers.get(f"{prefix}-{name}") for name in names}
    for c in containers.values():
        wait_for_engine(c)
    known = workdir / "machines_known_hosts"
    known.write_text("".join(f"{addresses[n]} {' '.join(_host_key(c).split()[:2])}\n" for n, c in containers.items()))
    machines_yaml = workdir / "machines.yaml"
    lines = ["all:", "  vars:", "    ansible_user: root", f"    ansible_ssh_private_key_file: {key}",
             f"    ssh_known_hosts_file: {known}", "  hosts:"]
    lines += [f"    {n}: {{ansible_host: {addresses[n]}}}" for n in names]
    machines_yaml.write_text("\n".join(lines) + "\n")
    return Machines(machines_yaml, names, addresses, prefix, workdir / "tls")


def certificates(client_dir: Path, addresses: dict[str, str]) -> dict[str, dict[str, bytes]]:
    """A CA of the test's own, a client certificate of it in ``client_dir`` (ca.pem, cert.pem,
    key.pem, as DOCKER_CERT_PATH holds them), and each machine's server files, by name, as paths
    under /etc/lab-machine (the certificate names the machine's address)."""
    now = datetime.datetime.now(datetime.timezone.utc)

    def issue(subject: str, key: ec.EllipticCurvePrivateKey, ca: x509.Certificate | None,
              signer: ec.EllipticCurvePrivateKey, *extensions: x509.ExtensionType) -> x509.Certificate:
        """A certificate as strict verifiers want it (Python 3.13's VERIFY_X509_STRICT): key
        usages, key identifiers, a CA's constraints critical."""
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)])
        usage = dict.fromkeys(("digital_signature", "content_commitment", "key_encipherment", "data_encipherment",
                               "key_agreement", "key_cert_sign", "crl_sign", "encipher_only", "decipher_only"), False)
        usage.update({"key_cert_sign": True, "crl_sign": True} if ca is None else {"digital_signature": True})
        builder = (x509.CertificateBuilder().subject_name(name).issuer_name(ca.subject if ca else name)
                   .public_key(key.public_key()).serial_number(x509.random_serial_number())
                   .not_valid_before(now - datetime.timedelta(minutes=5))
                   .not_valid_after(now + datetime.timedelta(days=1))
                   .add_extension(x509.BasicConstraints(ca=ca is None, path_length=None), critical=True)
                   .add_extension(x509.KeyUsage(**usage), critical=True)
                   .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False))
        if ca is not None:
            builder = builder.add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(
                ca.public_key()), critical=False)
        for extension in extensions:
            builder = builder.add_extension(extension, critical=False)
        return builder.sign(signer, hashes.SHA256())

    def pem(key: ec.EllipticCurvePrivateKey) -> bytes:
        return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                 serialization.NoEncryption())

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = issue("lab test machines CA", ca_key, None, ca_key)
    ca_pem = ca.public_bytes(serialization.Encoding.PEM)
    client_key = ec.generate_private_key(ec.SECP256R1())
    client_cert = issue("lab", client_key, ca, ca_key,
                        x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]))
    client_dir.mkdir(mode=0o700)
    for file, data in (("ca.pem", ca_pem), ("cert.pem", client_cert.public_bytes(serialization.Encoding.PEM)),
                       ("key.pem", pem(client_key))):
        (client_dir / file).write_bytes(data)
    servers = {}
    for name, address in addresses.items():
        key = ec.generate_private_key(ec.SECP256R1())
        cert = issue(name, key, ca, ca_key, x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]),
                     x509.SubjectAlternativeName([x509.DNSName(name),
                                                  x509.IPAddress(ipaddress.ip_address(address))]))
        servers[name] = {"tls/ca.pem": ca_pem, "tls/cert.pem": cert.public_bytes(serialization.Encoding.PEM),
                         "tls/key.pem": pem(key)}
    return servers


def wait_for_engine(c: docker.models.containers.Container) -> None:
    deadline = time.monotonic() + ENGINE_WAIT
    while True:
        code, out = c.exec_run(["docker", "info", "--format", "{{.ServerVersion}}"])
        if code == 0:
            return
        if time.monotonic() > deadline:
            _, log = c.exec_run(["tail", "-5", "/var/log/dockerd.log"])
            raise AssertionError(f"the engine of {c.name} did not start: {out!r} {log!r}")
        time.sleep(0.5)


def kill(found: Machines, name: str) -> subprocess.CompletedProcess[str]:
    """Machine ``name`` goes down at once, as a VM pulled off: its engine, sshd and lab hosts."""
    return subprocess.run(["docker", "kill", found.container(name)], capture_output=True, text=True, timeout=60)


def restart(found: Machines, name: str) -> None:
    """Machine ``name`` up again (its host key and engine state kept), its engine answering."""
    subprocess.run(["docker", "start", found.container(name)], check=True, capture_output=True, timeout=60)
    wait_for_engine(docker.from_env().containers.get(found.container(name)))


def _host_key(c: docker.models.containers.Container) -> str:
    deadline = time.monotonic() + ENGINE_WAIT
    while True:
        code, out = c.exec_run(["cat", "/etc/ssh/ssh_host_ed25519_key.pub"])
        if code == 0 and out.strip():
            return bytes(out).decode()
        assert time.monotonic() < deadline, f"{c.name} made no host key"
        time.sleep(0.2)


def _tar(files: dict[str, bytes]) -> bytes:
    """A tar of ``files`` (path -> content), each 0600, with the directories they are in."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for directory in sorted({str(Path(path).parent) for path in files} - {"."}):
            info = tarfile.TarInfo(directory)
            info.type, info.mode = tarfile.DIRTYPE, 0o700
            tar.addfile(info)
        for path, data in files.items():
            info = tarfile.TarInfo(path)
            info.size, info.mode = len(data), 0o600
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def remove(client: docker.DockerClient, prefix: str) -> None:
    """Every machine of ``prefix``, its volume and network, and its engine's cgroup directories."""
    for c in client.containers.list(all=True, ignore_removed=True, filters={"label": f"{TEST_LABEL}={prefix}"}):
        c.remove(force=True, v=True)
    for v in client.volumes.list(filters={"label": f"{TEST_LABEL}={prefix}"}):
        v.remove(force=True)
    for n in client.networks.list(filters={"label": f"{TEST_LABEL}={prefix}"}):
        try:
            n.remove()
        except NotFound:
            pass
    for directory in _dind_cgroups():
        try:
            directory.rmdir()
        except OSError:
            pass


def _dind_cgroups() -> Iterator[Path]:
    """The machines' cgroup directories, the deepest first (rmdir takes only empty ones)."""
    found = [d for controller in CGROUP_ROOT.iterdir() if controller.is_dir()
             for d in controller.glob("dind-*") if d.is_dir()]
    nested = [sub for d in found for sub in d.rglob("*") if sub.is_dir()]
    yield from sorted(nested, key=lambda p: len(p.parts), reverse=True)
    yield from found
